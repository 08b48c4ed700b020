// Command podinit measures how much of Podman's start work Podman itself
// does at once, for bench/host.sh: N containers started one by one, against
// N more initialised all at once (runc create, conmon, the network: all of a
// start but the process's exec) and then started in order. Their image and
// command are the arguments; the containers are named podinit-*.
// Usage: podinit SOCKET IMAGE N
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
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
	t0 := time.Now()
	start(ids)
	serial := time.Since(t0)
	ids = create("atonce")
	t0 = time.Now()
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
	both := time.Since(t0)
	fmt.Printf("  %d starts one by one:                     %5d ms\n", n, serial.Milliseconds())
	fmt.Printf("  %d inits at once, then %d starts in order: %5d ms (the inits %d ms)\n", n, n, both.Milliseconds(), inits.Milliseconds())
}
