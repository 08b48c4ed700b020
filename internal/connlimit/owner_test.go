package connlimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The test binary run as another user dials CONNLIMIT_TEST_DIAL that many
// times (CONNLIMIT_TEST_DIALS), says so, and holds the connections until
// its input closes.
func TestMain(m *testing.M) {
	if addr := os.Getenv("CONNLIMIT_TEST_DIAL"); addr != "" {
		n, _ := strconv.Atoi(os.Getenv("CONNLIMIT_TEST_DIALS"))
		var held []net.Conn
		for i := range n {
			// From 127.0.0.1, .2, .3...: any address of 127.0.0.0/8 is
			// the machine's.
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i))}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				fmt.Println("error:", err)
				os.Exit(1)
			}
			held = append(held, c)
		}
		fmt.Println("dialled")
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// LoopbackOwner names the user of the client's socket, over IPv4 and IPv6
// loopback.
func TestLoopbackOwner(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if got := LoopbackOwner(s); got != os.Getuid() {
			t.Errorf("%s: owner %d, want %d", addr, got, os.Getuid())
		}
		c.Close()
		s.Close()
		ln.Close()
	}
}

// A local user holding every place a loopback source has does not keep
// another user (the operator's ssh -L) out: with Owner set, each user's
// connections are counted apart, by user whatever loopback address they
// come from. Run as root (CI is): the other user is
// nobody (65534), the test binary run again under that uid.
func TestLoopbackUsersAreCountedApart(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test runs a process as another user: run it as root (CI does)")
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	turned := make(chan int, 1)
	l := &Listener{Listener: inner, Bounds: New(10, 2), Owner: LoopbackOwner, TurnedAway: func(_ netip.Addr, open int) { turned <- open }}
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	// Nobody dials three, each from another loopback address: two let
	// in, the third turned away.
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dialer")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "CONNLIMIT_TEST_DIAL="+inner.Addr().String(), "CONNLIMIT_TEST_DIALS=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "dialled\n" {
		t.Fatalf("the dialer as nobody said %q", line)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	take := func(want int, who string) {
		t.Helper()
		for range want {
			select {
			case c := <-accepted:
				conns = append(conns, c)
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: %d of %d connections let in", who, len(conns), want)
			}
		}
	}
	take(2, "nobody")
	select {
	case open := <-turned:
		if open != 2 {
			t.Fatalf("nobody's third connection turned away with %d open", open)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("nobody's third connection was not turned away (%d open)", l.Bounds.Open())
	}
	// Root, from the same address, still has its own two places.
	for range 2 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	take(2, "root")
	if open := l.Bounds.Open(); open != 4 {
		t.Fatalf("%d open, want nobody's two and root's two", open)
	}
	for _, c := range conns {
		if LoopbackOwner(c) == NoOwner {
			t.Errorf("no owner found for %s", c.RemoteAddr())
		}
	}
}
