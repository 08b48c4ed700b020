// Command podinit measures how much of Podman's start work Podman itself
// does at once, for bench/host.sh: N containers started one by one, against
// N more initialised all at once (runc create, conmon, the network: all of a
// start but the process's exec) and then started in order, each with the CPU
// time the whole machine was busy meanwhile: when starts one by one already
// keep the cores busy, starting at once cannot be much faster. Their image
// and command are the arguments; the containers are named podinit-*.
// Usage: podinit SOCKET IMAGE N
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/specgen"
	"github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: podinit SOCKET IMAGE N")
	}
	n, err := strconv.Atoi(os.Args[3])
	if err != nil || n < 1 {
		log.Fatalf("N %q: a count of containers", os.Args[3])
	}
	ctx, err := bindings.NewConnection(context.Background(), "unix://"+os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	create := func(prefix string) []string {
		var ids []string
		for i := 0; i < n; i++ {
			s := specgen.NewSpecGenerator(os.Args[2], false)
			s.Name = fmt.Sprintf("podinit-%s%02d", prefix, i)
			s.Command = []string{"sleep", "100000"}
			s.Rlimits = []specs.POSIXRlimit{{Type: "nofile", Hard: 1024, Soft: 1024}, {Type: "nproc", Hard: 1024, Soft: 1024}}
			r, err := containers.CreateWithSpec(ctx, s, nil)
			if err != nil {
				log.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		return ids
	}
	start := func(ids []string) {
		for _, id := range ids {
			if err := containers.Start(ctx, id, nil); err != nil {
				log.Fatal(err)
			}
		}
	}
	ids := create("serial")
	t0, c0 := time.Now(), busy()
	start(ids)
	serial, serialCPU := time.Since(t0), busy()-c0
	ids = create("atonce")
	t0, c0 = time.Now(), busy()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- containers.ContainerInit(ctx, id, nil) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			log.Fatal(err)
		}
	}
	inits := time.Since(t0)
	start(ids)
	both, bothCPU := time.Since(t0), busy()-c0
	fmt.Printf("  %d starts one by one:                     %5d ms, the machine's CPU busy %5d ms (%.1f of %d cores)\n",
		n, serial.Milliseconds(), serialCPU.Milliseconds(), serialCPU.Seconds()/serial.Seconds(), runtime.NumCPU())
	fmt.Printf("  %d inits at once, then %d starts in order: %5d ms, the machine's CPU busy %5d ms (%.1f of %d cores; the inits %d ms)\n",
		n, n, both.Milliseconds(), bothCPU.Milliseconds(), bothCPU.Seconds()/both.Seconds(), runtime.NumCPU(), inits.Milliseconds())
}

// busy is the CPU time all of the machine's cores have spent busy since boot
// (/proc/stat: all but idle and iowait): a start's cost is spread over
// Podman, conmon, runc and netavark's iptables, so it is counted machine-wide.
func busy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		log.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		log.Fatalf("/proc/stat: unexpected first line %q", line)
	}
	var ticks int64
	for i, v := range f[1:8] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			log.Fatalf("/proc/stat: %v", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
