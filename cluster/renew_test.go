package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Certificates of a short life (MESH_CERT_LIFETIME) renew on both nodes
// while writes go on, without a restart: no acknowledged write is lost,
// the state records each node's new expiry, and after the first
// certificates have expired a write forwarded over a new connection (both
// sides checking the other's certificate) still lands.
func TestCertificateRenewsWithoutARestart(t *testing.T) {
	t.Setenv(NodeCertLifeEnv, "12s")
	ctx := context.Background()
	a, b := twoNodes(t)
	first := map[string]time.Time{"ace": a.Node.tls.current().Leaf.NotAfter, "novox": b.Node.tls.current().Leaf.NotAfter}

	// Writes through novox (forwarded to the leader) all along.
	var mu sync.Mutex
	acked := 0
	var refused []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			name := fmt.Sprintf("m%d", i)
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := b.Node.Propose(wctx, addModule(t, name+".yaml", "module: "+name+"\n"))
			cancel()
			mu.Lock()
			if err == nil {
				acked++
			} else {
				refused = append(refused, err.Error())
			}
			mu.Unlock()
		}
	}()

	// Both renew, and say so in the state.
	deadline := time.Now().Add(30 * time.Second)
	for {
		nodes, _ := a.Store.Nodes(ctx)
		renewed := 0
		for _, n := range nodes {
			if n.CertExpires != nil && n.CertExpires.After(first[n.Name]) {
				renewed++
			}
		}
		if renewed == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not both certificates renewed in the state within 30s: %+v", nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Past the first certificates' expiry, a new connection: each side
	// checks the other's certificate, so this needs both renewed ones.
	time.Sleep(time.Until(later(first["ace"], first["novox"])) + 500*time.Millisecond)
	close(stop)
	wg.Wait()
	b.Node.peers.CloseIdleConnections()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Node.Propose(wctx, addModule(t, "after.yaml", "module: after\n")); err != nil {
		t.Fatalf("a write over a new connection after the first certificates expired: %v", err)
	}
	acked++
	if len(refused) > 0 {
		t.Fatalf("%d writes refused while the certificates renewed, first: %s", len(refused), refused[0])
	}
	if acked < 20 {
		t.Fatalf("only %d writes were acknowledged during the renewals", acked)
	}
	for _, m := range []*Member{a, b} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			mods, _ := m.Store.Modules(ctx)
			if len(mods) == acked {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d modules; %d writes were acknowledged", m.ID.Name, len(mods), acked)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, m := range []*Member{a, b} {
		if got := m.Node.tls.current().Leaf.NotAfter; !got.After(first[m.ID.Name]) {
			t.Fatalf("%s still presents its first certificate", m.ID.Name)
		}
	}
	t.Logf("%d writes acknowledged while both certificates (life 12s) renewed", acked)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
