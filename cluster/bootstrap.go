package cluster

import (
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"mesh/state"
)

// A machine that is to join gets the mesh binary from the mesh itself: every
// node serves the mesh CA on its node port to anyone (it is public), and a
// voter its own binary to a holder of a join token valid now, sent as
// Authorization: Bearer TOKEN (the binary holds no secret, but tens of
// megabytes to anyone who asks were a stranger's way to hold the download
// slots, keeping the install line out, and to spend a VPS's metered
// traffic). The install line `mesh token` prints fetches the CA, checks it
// against the digest the token pins, and only then fetches the binary over
// TLS verified by that CA: no trust on first use.

// Downloads of the binary are bounded, in all and per address, and a
// reader too slow (or one that never reads) loses its slot: two guests that
// asked and never read held both slots once, and the install line then got
// 503 for good.
const (
	maxBinaryDownloads       = 4
	maxBinaryDownloadsPerSrc = 1
	// binaryChunk must be taken by the reader within binaryChunkTime.
	binaryChunk = 1 << 20
)

// binaryChunkTime is how long a reader has to take each chunk.
var binaryChunkTime = newTunable(15 * time.Second)

func (n *Node) serveCA(w http.ResponseWriter, r *http.Request) {
	if hasBody(r) {
		boundRest(w)
		http.Error(w, "a GET of the CA has no body", http.StatusBadRequest)
		return
	}
	b, _ := pem.Decode(n.tls.caPEM())
	if b == nil {
		http.Error(w, "this node has no CA certificate", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/pkix-cert")
	w.Write(b.Bytes)
}

func (n *Node) serveBinary(w http.ResponseWriter, r *http.Request) {
	if hasBody(r) {
		boundRest(w)
		http.Error(w, "a GET of the binary has no body", http.StatusBadRequest)
		return
	}
	if status, msg := n.tokenHolder(r); status != 0 {
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", "Bearer")
		}
		http.Error(w, msg, status)
		return
	}
	src := netip.Addr{}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		src = ap.Addr().Unmap()
	}
	if _, ok := n.downloads.Take(src); !ok {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "busy serving the binary (to this address, or to as many machines as it serves at once); retry in a few seconds", http.StatusServiceUnavailable)
		return
	}
	defer n.downloads.Give(src)
	self, err := os.Executable()
	if err != nil {
		http.Error(w, "cannot find this node's binary: "+err.Error(), http.StatusInternalServerError)
		return
	}
	f, err := os.Open(self)
	if err != nil {
		http.Error(w, "cannot read this node's binary: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.Header().Set("X-Mesh-Version", n.cfg.Version)
	w.Header().Set("X-Mesh-Platform", runtime.GOOS+"/"+runtime.GOARCH)
	rc := http.NewResponseController(w)
	buf := make([]byte, 64<<10)
	for sent, next := int64(0), int64(0); ; {
		if sent >= next {
			rc.SetWriteDeadline(time.Now().Add(binaryChunkTime.get()))
			next = sent + binaryChunk
		}
		k, rerr := f.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return // a reader too slow: its slot goes to the next
			}
			sent += int64(k)
		}
		if rerr != nil {
			return
		}
	}
}

// tokenHolder says why r may not have the binary (an HTTP status and a
// message; 0 when it may): it must carry a join token of this mesh, valid
// now, as Authorization: Bearer TOKEN. Checked before a download slot is
// taken, so that a stranger holds none.
func (n *Node) tokenHolder(r *http.Request) (int, string) {
	t, err := bearerToken(r.Header.Get("Authorization"))
	if err != nil {
		return http.StatusUnauthorized, err.Error()
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	req := JoinRequest{MeshID: t.MeshID, Secret: t.Secret, Until: t.Until, Name: "(a download of the binary)", Address: host}
	if _, err := n.checkTokenSecret(r.Context(), req); err != nil {
		switch {
		case errors.Is(err, state.ErrInvalid):
			return http.StatusForbidden, err.Error()
		case errors.Is(err, state.ErrConflict):
			// Another mesh's token, a rotation of the CA under way, or a
			// node that opens no join secret (a non-voter): said so.
			return http.StatusConflict, err.Error()
		}
		return http.StatusServiceUnavailable, "cannot check the join token now: " + err.Error()
	}
	return 0, ""
}

// bearerToken reads the join token of an Authorization header's value
// ("Bearer TOKEN"), whoever sent it.
func bearerToken(h string) (Token, error) {
	scheme, raw, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Token{}, errors.New("the binary is served to a holder of a join token: send it as Authorization: Bearer TOKEN (the line `mesh token --install-line` prints does)")
	}
	return ParseToken(strings.TrimSpace(raw))
}

// unameMachine is `uname -m` for this binary's architecture.
func unameMachine() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "386":
		return "i686"
	}
	return runtime.GOARCH
}

// InstallLine is one shell line for a machine with nothing of the mesh on
// it (curl, sha256sum and base64 are all it uses): it checks the machine's
// architecture, fetches the mesh CA from peer and checks it against the
// digest in token, fetches peer's binary over TLS verified by that CA into
// bin, and joins. peer is IP[:PORT] of a node (its certificate names the IP).
// The work is an sh -ec '...' (a failure stops it, not the shell it is
// pasted into, and its temporary directory goes whatever happens: dash
// runs no EXIT trap when a signal ends it, so a Ctrl-C, a hang-up or a
// kill exits through the trap); the
// token reaches the script on its standard input, from a printf of the
// pasting shell (a builtin, no process of its own), and curl in a header
// file of that directory and mesh join on their standard input, so it is
// in no process's command line for other users' ps to show. A refusal of
// the binary (a token that ended, a non-voter) is shown with its reason.
func InstallLine(peer, token, bin string) (string, error) {
	t, err := ParseToken(token)
	if err != nil {
		return "", err
	}
	host := peer
	if !strings.Contains(peer, ":") {
		host = peer + ":" + strconv.Itoa(DefaultPort)
	}
	base := "https://" + host
	return fmt.Sprintf(`printf '%%s\n' '%s' | sh -ec 'IFS= read -r t; [ "$(uname -m)" = %s ] || { echo "this machine is $(uname -m); the mesh at %s runs %s binaries" >&2; exit 1; }; `+
		`d=$(mktemp -d); trap "rm -rf \"$d\"" EXIT; trap "exit 130" INT TERM HUP; curl -fsSk %s/v1/ca -o "$d/ca.der" </dev/null; echo "%s  $d/ca.der" | sha256sum -c --quiet; `+
		`{ echo "-----BEGIN CERTIFICATE-----"; base64 -w64 "$d/ca.der"; echo "-----END CERTIFICATE-----"; } > "$d/ca.pem"; `+
		`printf "Authorization: Bearer %%s\n" "$t" > "$d/auth"; `+
		`c=$(curl -sS --cacert "$d/ca.pem" -H @"$d/auth" -o "$d/mesh" -w "%%{http_code}" %s/v1/binary </dev/null); `+
		`[ "$c" = 200 ] || { echo "the binary from %s: HTTP $c: $(head -c 400 "$d/mesh")" >&2; exit 1; }; install -m 0755 "$d/mesh" %s; rm -rf "$d"; `+
		`printf "%%s\n" "$t" | %s join %s --token-file -'`,
		token, unameMachine(), host, unameMachine(), base, t.CADigest, base, host, bin, bin, peer), nil
}
