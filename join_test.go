package main

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestLabelOf(t *testing.T) {
	for in, want := range map[string]string{"Ace": "ace", "web_01.example.org": "web-01", "-x-": "x", "höst": "hst"} {
		if got, err := labelOf(in); err != nil || got != want {
			t.Errorf("labelOf(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "...", "___", string(make([]byte, 64))} {
		if got, err := labelOf(in); err == nil {
			t.Errorf("labelOf(%q) = %q, want an error", in, got)
		}
	}
}

func TestSourceAddressToward(t *testing.T) {
	for _, peer := range []string{"127.0.0.1", "127.0.0.1:7431"} {
		a, err := sourceAddressToward(peer)
		if err != nil || net.ParseIP(a) == nil || !net.ParseIP(a).IsLoopback() {
			t.Fatalf("toward %s: %q %v", peer, a, err)
		}
	}
	if _, err := sourceAddressToward("not an address"); err == nil {
		t.Fatal("a bad peer gave an address")
	}
}

// The token comes from a file, stdin, MESH_TOKEN or --token (with a
// warning), and an empty or doubled one is refused.
func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/token"
	os.WriteFile(file, []byte("mesh1.from-file\n"), 0o600)
	stdin := func(s string) *os.File {
		p := dir + "/stdin"
		os.WriteFile(p, []byte(s), 0o600)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	for _, tc := range []struct {
		name   string
		cmd    JoinCmd
		stdin  string
		args   []string
		want   string
		warned bool
		err    string
	}{
		{name: "file", cmd: JoinCmd{TokenFile: file}, want: "mesh1.from-file"},
		{name: "stdin by -", cmd: JoinCmd{TokenFile: "-"}, stdin: "mesh1.piped\nrest", want: "mesh1.piped"},
		{name: "stdin by default", cmd: JoinCmd{}, stdin: "  mesh1.piped  \n", want: "mesh1.piped"},
		{name: "env", cmd: JoinCmd{Token: "mesh1.env"}, args: []string{"join", "10.0.0.1"}, want: "mesh1.env"},
		{name: "flag", cmd: JoinCmd{Token: "mesh1.flag"}, args: []string{"join", "10.0.0.1", "--token", "mesh1.flag"}, want: "mesh1.flag", warned: true},
		{name: "flag=", cmd: JoinCmd{Token: "mesh1.flag"}, args: []string{"join", "--token=mesh1.flag"}, want: "mesh1.flag", warned: true},
		{name: "both", cmd: JoinCmd{Token: "x", TokenFile: file}, args: []string{"--token", "x"}, err: "not both"},
		{name: "nothing on stdin", cmd: JoinCmd{}, stdin: "", err: "no join token"},
		{name: "empty file", cmd: JoinCmd{TokenFile: dir + "/stdin"}, stdin: "\n", err: "empty"},
		{name: "missing file", cmd: JoinCmd{TokenFile: dir + "/nope"}, err: "no such file"},
		{name: "a pipe nobody writes to", cmd: JoinCmd{}, stdin: "\x00pipe", err: "nothing came within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var warn strings.Builder
			in := stdin(tc.stdin)
			if tc.stdin == "\x00pipe" {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				defer r.Close()
				in = r
				stdinWait = 100 * time.Millisecond
				defer func() { stdinWait = 30 * time.Second }()
			}
			got, err := tc.cmd.readToken(in, &warn, tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("token %q, %v; want %q", got, err, tc.want)
			}
			if warned := strings.Contains(warn.String(), "shows in ps"); warned != tc.warned {
				t.Fatalf("warned %v, want %v (%q)", warned, tc.warned, warn.String())
			}
		})
	}
}
