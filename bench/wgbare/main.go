// Command wgbare is a bare wireguard-go device of the version mesh links,
// for bench/overlay.sh: tun.CreateTUN, device.NewDevice, IpcSet and Up,
// nothing of mesh's. The library's own ceiling, beside mesh's overlay.
//
//	wgbare NAME PRIVATE_HEX LISTEN_PORT PEER_PUBLIC_HEX PEER_ENDPOINT PEER_ALLOWED_IP
//
// The script gives the interface its address; wgbare runs until killed.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: wgbare NAME PRIVATE_HEX LISTEN_PORT PEER_PUBLIC_HEX PEER_ENDPOINT PEER_ALLOWED_IP")
		os.Exit(2)
	}
	t, err := tun.CreateTUN(os.Args[1], 1420)
	if err != nil {
		panic(err)
	}
	d := device.NewDevice(t, conn.NewDefaultBind(), device.NewLogger(device.LogLevelError, ""))
	if err := d.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%s\npublic_key=%s\nendpoint=%s\nallowed_ip=%s\n", os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6])); err != nil {
		panic(err)
	}
	if err := d.Up(); err != nil {
		panic(err)
	}
	fmt.Println("up")
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	<-c
	d.Close()
}
