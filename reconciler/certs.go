package reconciler

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"mesh/state"
)

// The certificates of the public edge (issue 28). The mesh never holds a
// certificate: the node's route proxy gets its own over ACME. What the
// node reports is what the proxy serves: for each public routed name of
// its plan, a TLS handshake with the container that publishes port 443,
// for that name, gives the certificate's issuer and expiry, or the
// handshake's error; then the last error the proxy logged for the name
// (Caddy logs the ACME client's, as JSON with the name as "identifier")
// says why. The handshake verifies nothing: the node only reports; the
// operator's client (and the bed) verify against the ACME CA's root.

// certCheckEvery is how often the served certificates are looked at (and
// soon after every apply that changes the names or the proxy).
var certCheckEvery = 15 * time.Second

// certLogLines is how much of the proxy's output is searched for an error.
const certLogLines = 1000

// certTargets is what to probe: the proxy container and where it answers,
// and the public names with the module that routes each.
type certTargets struct {
	container string
	module    string // the proxy container's, whose secrets its log may show
	addr      string // host:port
	names     [][2]string
}

// certTargetsOf reads the plan: the public routes, and the container that
// publishes host port 443 (tcp) on dial, the node's address ("" when the
// node has none to probe at: then nothing is probed).
func certTargetsOf(plan *state.Plan, dial string) certTargets {
	var t certTargets
	if dial == "" {
		return t
	}
	for _, res := range plan.Resources {
		if res.Kind != "container" {
			continue
		}
		for _, p := range res.Typed.PublicPorts {
			if p.HostPort == 443 && p.Protocol != "udp" {
				host := dial
				if ip, err := netip.ParseAddr(p.HostIP); err == nil && !ip.IsUnspecified() {
					host = ip.String()
				}
				t.container, t.module, t.addr = res.RuntimeName(), res.Module, net.JoinHostPort(host, "443")
			}
		}
	}
	if t.container == "" {
		return certTargets{}
	}
	for _, r := range plan.Routes {
		if strings.Contains(r.Name, ".") && len(t.names) < state.MaxCertificates {
			t.names = append(t.names, [2]string{r.Name, r.Module})
		}
	}
	return t
}

// certProbes is how many names are looked at at once, and certRound how
// long one look at them all may take: a proxy that stalls each handshake
// costs a round, not 5 s per name.
const (
	certProbes = 4
	certRound  = 60 * time.Second
)

func (t certTargets) equal(o certTargets) bool {
	return t.container == o.container && t.module == o.module && t.addr == o.addr && slices.Equal(t.names, o.names)
}

// probeCerts looks at every target name once. The proxy's logged error
// goes into the node's report, which every node keeps: it is read with
// the proxy module's secrets taken out (a DNS provider's token in the URL
// of a failed request).
func probeCerts(ctx context.Context, rt Runtime, t certTargets, secrets *secretValues) []state.CertStatus {
	if t.container == "" || len(t.names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, certRound)
	defer cancel()
	out := make([]state.CertStatus, len(t.names))
	failed := make([]error, len(t.names))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(certProbes, len(t.names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c := state.CertStatus{Name: t.names[i][0], Module: t.names[i][1]}
				issuer, notAfter, err := handshake(ctx, t.addr, c.Name)
				if err == nil {
					c.Issuer, c.NotAfter = issuer, notAfter.UTC()
					if time.Now().After(notAfter) {
						c.Error = "the certificate it serves expired at " + c.NotAfter.Format(time.RFC3339)
					}
				}
				out[i], failed[i] = c, err
			}
		}()
	}
	for i := range t.names {
		next <- i
	}
	close(next)
	wg.Wait()
	var logs string
	for i, err := range failed {
		if err == nil {
			continue
		}
		if logs == "" {
			logs, _ = rt.Logs(context.WithoutCancel(ctx), t.container, certLogLines)
			logs = secrets.redact(t.module, logs)
		}
		out[i].Error = "no certificate served (" + stableError(err) + ")"
		if e := lastLoggedError(logs, out[i].Name); e != "" {
			out[i].Error += ": " + e
		}
	}
	return out
}

// stableError is err without what changes from one try to the next (a
// dial's local port), so an unchanged failure is not a new report.
func stableError(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Op + " " + op.Net + " " + fmt.Sprint(op.Addr) + ": " + op.Err.Error()
	}
	return err.Error()
}

// handshake asks addr for name's certificate (SNI) and returns its issuer
// and expiry.
func handshake(ctx context.Context, addr, name string) (string, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{ServerName: name, InsecureSkipVerify: true}} // reported, never trusted
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", time.Time{}, err
	}
	defer conn.Close()
	cs := conn.(*tls.Conn).ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return "", time.Time{}, fmt.Errorf("no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if err := leaf.VerifyHostname(name); err != nil {
		return "", time.Time{}, fmt.Errorf("the certificate it serves is for %s", strings.Join(leaf.DNSNames, ", "))
	}
	return leaf.Issuer.CommonName, leaf.NotAfter, nil
}

// lastLoggedError finds the last error the proxy logged about name: a
// JSON line (Caddy's) at level error whose "identifier" is the name gives
// its "error", as does one whose error starts with "[name] " (Caddy's
// "will retry"). Other lines are not read: a plain line carries a time,
// and would make every look a new report.
func lastLoggedError(logs, name string) string {
	lines := strings.Split(logs, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if !strings.Contains(l, name) {
			continue
		}
		var j struct {
			Level      string `json:"level"`
			Identifier string `json:"identifier"`
			Error      string `json:"error"`
			Msg        string `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &j) != nil || j.Level != "error" || j.Error == "" {
			continue
		}
		if j.Identifier == name {
			return j.Msg + ": " + j.Error
		}
		// Caddy's "will retry" names the identifier in the error alone.
		if j.Identifier == "" && strings.HasPrefix(j.Error, "["+name+"] ") {
			return strings.TrimPrefix(j.Error, "["+name+"] ")
		}
	}
	return ""
}

// certKey is what a change of the certificates is compared by.
func certKey(cs []state.CertStatus) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.Name + " " + c.Issuer + " " + strconv.FormatInt(c.NotAfter.Unix(), 10) + " " + c.Error + "\n")
	}
	return b.String()
}

// setCerts replaces what is probed after an apply; a change is probed at once.
func (m *monitor) setCerts(plan *state.Plan) {
	t := certTargetsOf(plan, m.certDial)
	m.mu.Lock()
	same := t.equal(m.certT)
	m.certT = t
	if len(t.names) == 0 && len(m.certs) > 0 {
		m.certs = nil
		m.notifyLocked()
	}
	m.mu.Unlock()
	if !same {
		select {
		case m.certWake <- struct{}{}:
		default:
		}
	}
}

// runCerts probes every certCheckEvery, and when woken, until ctx ends.
func (m *monitor) runCerts(ctx context.Context) {
	if m.certDial == "" {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.certWake:
		case <-time.After(certCheckEvery):
		}
		m.mu.Lock()
		t := m.certT
		m.mu.Unlock()
		cs := probeCerts(ctx, m.rt, t, m.secrets)
		m.mu.Lock()
		if t.equal(m.certT) && certKey(cs) != certKey(m.certs) {
			m.certs = cs
			m.notifyLocked()
		}
		m.mu.Unlock()
	}
}

// certsSnapshot is what the node's proxy served when last looked at.
func (m *monitor) certsSnapshot() []state.CertStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.certs)
}
