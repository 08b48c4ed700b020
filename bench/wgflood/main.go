// Command wgflood sends what a hostile peer on the network could send to a
// node's WireGuard port, for the overlay bed and bench/overlay.sh:
//
//	wgflood garbage IP:PORT N        N random datagrams of 1 to 1400 bytes
//	wgflood replay IP:PORT FILE.pcap every UDP datagram to PORT in a capture, again
//
// It prints how many datagrams it sent and how long it took.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: wgflood garbage IP:PORT N | wgflood replay IP:PORT FILE.pcap")
		os.Exit(2)
	}
	to, err := net.ResolveUDPAddr("udp", os.Args[2])
	if err != nil {
		fail(err)
	}
	c, err := net.DialUDP("udp", nil, to)
	if err != nil {
		fail(err)
	}
	var payloads [][]byte
	switch os.Args[1] {
	case "garbage":
		n, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fail(err)
		}
		for i := 0; i < n; i++ {
			size, _ := rand.Int(rand.Reader, big.NewInt(1400))
			b := make([]byte, size.Int64()+1)
			rand.Read(b)
			payloads = append(payloads, b)
		}
	case "replay":
		payloads, err = udpPayloads(os.Args[3], to.Port)
		if err != nil {
			fail(err)
		}
		if len(payloads) == 0 {
			fail(fmt.Errorf("%s holds no datagram to port %d", os.Args[3], to.Port))
		}
	default:
		fail(errors.New("garbage or replay"))
	}
	start := time.Now()
	sent := 0
	for _, p := range payloads {
		if _, err := c.Write(p); err == nil {
			sent++
		}
	}
	fmt.Printf("sent %d datagrams to %s in %s\n", sent, to, time.Since(start).Round(time.Millisecond))
}

// udpPayloads reads a pcap file (Ethernet frames) and returns the payload of
// every IPv4 UDP datagram to port.
func udpPayloads(file string, port int) ([][]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(b) < 24 {
		return nil, errors.New("not a pcap file")
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, errors.New("not a pcap file")
	}
	if bo.Uint32(b[20:]) != 1 {
		return nil, errors.New("not a capture of Ethernet frames")
	}
	var out [][]byte
	for off := 24; off+16 <= len(b); {
		n := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			break
		}
		f := b[off : off+n]
		off += n
		if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		udp := ip[ihl:]
		if int(binary.BigEndian.Uint16(udp[2:])) != port {
			continue
		}
		out = append(out, append([]byte(nil), udp[8:]...))
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wgflood:", err)
	os.Exit(1)
}
