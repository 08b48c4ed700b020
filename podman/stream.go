package podman

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/containers/podman/v5/pkg/api/handlers"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
)

// The streams of `mesh logs` and `mesh exec` (issue 29): a container's
// output as lines, read from Podman's socket with every frame bounded, and
// an exec session whose standard streams are the caller's.

// MaxLogLine bounds one line of a log stream: a longer one is cut to its
// first MaxLogLine bytes (Cut says so) and the rest is read and dropped, so
// a container printing a line of gigabytes costs the agent 64 KiB.
const MaxLogLine = 64 << 10

// LogLine is one line a container wrote.
type LogLine struct {
	// Time is when Podman's log took the line (to the second: Podman's API
	// gives no finer).
	Time   time.Time
	Stream string // stdout or stderr
	Text   string // without its newline
	// Partial: the container wrote no newline after it (yet).
	Partial bool
	// Cut: the line was longer than MaxLogLine.
	Cut bool
}

// LogOptions say which lines a log stream reads.
type LogOptions struct {
	// Follow: after the lines there are, wait for new ones until the
	// container stops or ctx ends.
	Follow bool
	// Since: only lines from then on (zero: all).
	Since time.Time
	// Tail: only the last Tail lines there are (0 or less: all).
	Tail int
}

// StreamLogs calls each for every line of a container's log in order,
// one at a time: a slow caller slows the read (Podman waits), it never
// makes the agent hold more than a line.
func (c *Client) StreamLogs(ctx context.Context, id string, o LogOptions, each func(LogLine) error) error {
	cx, cancel, err := c.ctx(ctx, 0)
	if err != nil {
		return err
	}
	defer cancel()
	conn, err := bindings.GetClient(cx)
	if err != nil {
		return err
	}
	params := url.Values{}
	params.Set("stdout", "true")
	params.Set("stderr", "true")
	params.Set("timestamps", "true")
	params.Set("follow", strconv.FormatBool(o.Follow))
	if o.Tail > 0 {
		params.Set("tail", strconv.Itoa(o.Tail))
	}
	if !o.Since.IsZero() {
		params.Set("since", strconv.FormatInt(o.Since.Unix(), 10))
	}
	resp, err := conn.DoRequest(cx, nil, http.MethodGet, "/containers/%s/logs", params, nil, id)
	if err != nil {
		return fmt.Errorf("logs of %s: %w", short(id), err)
	}
	defer resp.Body.Close()
	if !resp.IsSuccess() {
		return fmt.Errorf("logs of %s: %w", short(id), resp.Process(nil))
	}
	err = readLogFrames(resp.Body, each)
	if ctx.Err() != nil {
		return nil // the caller stopped reading
	}
	return err
}

// readLogFrames reads Podman's multiplexed log stream (an 8-byte header:
// the stream, 3 zero bytes, the frame's length; then the frame, which is
// "TIME TEXT\n") and calls each per frame.
func readLogFrames(r io.Reader, each func(LogLine) error) error {
	br := bufio.NewReaderSize(r, 32<<10)
	var hdr [8]byte
	buf := make([]byte, MaxLogLine+64) // the time and a space before the text
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read the log stream: %w", err)
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		keep := min(n, int64(len(buf)))
		if _, err := io.ReadFull(br, buf[:keep]); err != nil {
			return fmt.Errorf("read the log stream: %w", err)
		}
		cut := false
		if n > keep {
			if _, err := io.CopyN(io.Discard, br, n-keep); err != nil {
				return fmt.Errorf("read the log stream: %w", err)
			}
			cut = true
		}
		var stream string
		switch hdr[0] {
		case 0, 1:
			stream = "stdout"
		case 2:
			stream = "stderr"
		case 3:
			return fmt.Errorf("podman: %s", bytes.TrimSpace(buf[:keep]))
		default:
			return fmt.Errorf("read the log stream: unknown stream %d", hdr[0])
		}
		l := parseLogFrame(buf[:keep])
		l.Stream, l.Cut = stream, l.Cut || cut
		if cut {
			l.Partial = false
		}
		if err := each(l); err != nil {
			return err
		}
	}
}

// parseLogFrame reads "TIME TEXT[\n]"; a frame without a readable time is
// all text (its time zero).
func parseLogFrame(b []byte) LogLine {
	var l LogLine
	if sp := bytes.IndexByte(b, ' '); sp > 0 && sp <= 40 {
		if t, err := time.Parse(time.RFC3339Nano, string(b[:sp])); err == nil {
			l.Time, b = t, b[sp+1:]
		}
	}
	if len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	} else {
		l.Partial = true
	}
	if len(b) > MaxLogLine {
		b, l.Cut = b[:MaxLogLine], true
	}
	l.Text = string(b)
	return l
}

// ExecConfig is a command to run in a running container.
type ExecConfig struct {
	Cmd   []string
	TTY   bool
	Stdin bool
	// Width and Height are the terminal's size (with TTY).
	Width, Height uint16
}

// ExecSession is a command running in a container: Stdin writes to its
// standard input, Output copies its output until it ends, ExitCode says
// how it ended.
type ExecSession struct {
	c    *Client
	id   string
	tty  bool
	conn net.Conn
	rd   *bufio.Reader
}

// ErrNotRunning: exec into a container that is not running.
var ErrNotRunning = errors.New("the container is not running")

// Exec starts cfg.Cmd in the container called name (by its name alone).
func (c *Client) Exec(ctx context.Context, name string, cfg ExecConfig) (*ExecSession, error) {
	if len(cfg.Cmd) == 0 {
		return nil, errors.New("exec: no command")
	}
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, err
	}
	defer cancel()
	data, err := containers.Inspect(cx, name, nil)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", name, err)
	}
	// Podman takes an ID, or the start of one, where no container has
	// the name: the mesh execs in the container of that name alone (a
	// container of a plan not made yet, named like hex, would reach
	// another of the host's).
	if strings.TrimPrefix(data.Name, "/") != name {
		return nil, fmt.Errorf("inspect %s: no container of that name (%s is %s)", name, name, data.Name)
	}
	if data.State == nil || !data.State.Running {
		st := "unknown"
		if data.State != nil {
			st = data.State.Status
		}
		return nil, fmt.Errorf("%w (it is %s)", ErrNotRunning, st)
	}
	ec := new(handlers.ExecCreateConfig)
	ec.Cmd, ec.Tty, ec.AttachStdin, ec.AttachStdout, ec.AttachStderr = cfg.Cmd, cfg.TTY, cfg.Stdin, true, !cfg.TTY
	sid, err := containers.ExecCreate(cx, data.ID, ec)
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	s := &ExecSession{c: c, id: sid, tty: cfg.TTY}
	if err := s.start(ctx, cfg); err != nil {
		containers.ExecRemove(cx, sid, new(containers.ExecRemoveOptions).WithForce(true))
		return nil, err
	}
	return s, nil
}

// start asks Podman to start the session and takes over the connection
// (the bindings' ExecStartAndAttach reads the agent's own os.Stdin).
func (s *ExecSession) start(ctx context.Context, cfg ExecConfig) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", s.c.socket)
	if err != nil {
		return fmt.Errorf("connect to Podman at %s: %w", s.c.socket, err)
	}
	body, _ := json.Marshal(struct {
		Detach bool   `json:"Detach"`
		TTY    bool   `json:"Tty"`
		Height uint16 `json:"h"`
		Width  uint16 `json:"w"`
	}{TTY: cfg.TTY, Height: cfg.Height, Width: cfg.Width})
	req, _ := http.NewRequest(http.MethodPost, "http://d/v4.0.0/libpod/exec/"+s.id+"/start", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	conn.SetDeadline(time.Now().Add(CallTimeout))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return fmt.Errorf("start the exec session: %w", err)
	}
	rd := bufio.NewReaderSize(conn, 32<<10)
	resp, err := http.ReadResponse(rd, req)
	if err != nil {
		conn.Close()
		return fmt.Errorf("start the exec session: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		return fmt.Errorf("start the exec session: podman answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	conn.SetDeadline(time.Time{})
	s.conn, s.rd = conn, rd
	return nil
}

// Stdin is the command's standard input; closing it sends end of file.
func (s *ExecSession) Stdin() io.WriteCloser { return stdinOf{s.conn} }

type stdinOf struct{ c net.Conn }

func (w stdinOf) Write(p []byte) (int, error) { return w.c.Write(p) }
func (w stdinOf) Close() error {
	if cw, ok := w.c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Output copies the command's output to stdout and stderr (with a TTY, all
// of it to stdout) until the command ends.
func (s *ExecSession) Output(stdout, stderr io.Writer) error {
	if s.tty {
		_, err := io.Copy(stdout, s.rd)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(s.rd, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		var w io.Writer
		switch hdr[0] {
		case 1:
			w = stdout
		case 2:
			w = stderr
		case 3:
			msg, _ := io.ReadAll(io.LimitReader(s.rd, min(n, 4096)))
			return fmt.Errorf("podman: %s", bytes.TrimSpace(msg))
		default:
			w = io.Discard // an echo of stdin
		}
		if _, err := io.CopyN(w, s.rd, n); err != nil {
			return err
		}
	}
}

// Resize sets the terminal's size.
func (s *ExecSession) Resize(ctx context.Context, width, height uint16) error {
	if !s.tty {
		return nil
	}
	cx, cancel, err := s.c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	return containers.ResizeExecTTY(cx, s.id, new(containers.ResizeExecTTYOptions).WithWidth(int(width)).WithHeight(int(height)))
}

// ExitCode waits (a few seconds at most, once the output has ended) until
// Podman says the command has ended, and returns its exit code.
func (s *ExecSession) ExitCode(ctx context.Context) (int, error) {
	cx, cancel, err := s.c.ctx(ctx, CallTimeout)
	if err != nil {
		return -1, err
	}
	defer cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := containers.ExecInspect(cx, s.id, nil)
		if err != nil {
			return -1, fmt.Errorf("the exec session's end: %w", err)
		}
		if !in.Running {
			return in.ExitCode, nil
		}
		if time.Now().After(deadline) {
			return -1, errors.New("the command's output ended but podman still says it runs")
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close ends the session's connection (the command, if it still runs,
// loses its terminal and standard streams) and removes the session.
func (s *ExecSession) Close() {
	if s.conn != nil {
		s.conn.Close()
	}
	cx, cancel, err := s.c.ctx(context.Background(), 10*time.Second)
	if err != nil {
		return
	}
	defer cancel()
	containers.ExecRemove(cx, s.id, new(containers.ExecRemoveOptions).WithForce(true))
}

// IsNotRunning says whether err is Exec's refusal of a stopped container.
func IsNotRunning(err error) bool {
	return errors.Is(err, ErrNotRunning) || strings.Contains(fmt.Sprint(err), "container state improper")
}
