package api

// The streams of mesh logs and mesh exec (issue 29; the agent's operate
// package serves them): the wire types both ends use and the CLI's client.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// MaxRecord bounds one NDJSON record of a logs stream: a line of at most
// podman.MaxLogLine (64 KiB), escaped.
const MaxRecord = 512 << 10

// Record is one line of a logs stream, or what the stream says about
// itself: the sources it reads (the first record), a container replaced
// and followed on (Note), a source that failed (Error).
type Record struct {
	Node      string    `json:"node,omitempty"`
	Container string    `json:"container,omitempty"`
	Time      time.Time `json:"time,omitzero"`
	Stream    string    `json:"stream,omitempty"`
	Text      string    `json:"text,omitempty"`
	Partial   bool      `json:"partial,omitempty"`
	Cut       bool      `json:"cut,omitempty"`
	Note      string    `json:"note,omitempty"`
	Error     string    `json:"error,omitempty"`
	Sources   []Source  `json:"sources,omitempty"`
}

// Source is one container (or step) on one node.
type Source struct {
	Node      string `json:"node"`
	Container string `json:"container"`
	Step      bool   `json:"step,omitempty"`
}

// Exec message kinds: the first byte of each websocket message.
const (
	KindStdin    byte = 0 // to the command
	KindStdout   byte = 1 // from it
	KindStderr   byte = 2
	KindStdinEOF byte = 3 // the caller's input ended
	KindResize   byte = 4 // width, height: 2 bytes each, big-endian
	KindExit     byte = 5 // an Exit, as JSON; the last message
)

// Exit ends an exec stream: the command's exit code, or why it did not run.
type Exit struct {
	Code  int    `json:"code"`
	Error string `json:"error,omitempty"`
}

// ResizeMessage encodes a KindResize message.
func ResizeMessage(width, height uint16) []byte {
	b := []byte{KindResize, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[1:], width)
	binary.BigEndian.PutUint16(b[3:], height)
	return b
}

// LogQuery is what /v1/logs and /v1/op/logs take.
type LogQuery struct {
	Follow bool
	Since  time.Time
	Tail   int
}

func (q LogQuery) Values(v url.Values) {
	if q.Follow {
		v.Set("follow", "1")
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Tail > 0 {
		v.Set("tail", strconv.Itoa(q.Tail))
	}
}

func ParseLogQuery(v url.Values) (LogQuery, error) {
	q := LogQuery{Follow: v.Get("follow") == "1"}
	if s := v.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, fmt.Errorf("since %q is not a time (RFC 3339)", s)
		}
		q.Since = t
	}
	if s := v.Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, fmt.Errorf("tail %q is not a count of lines", s)
		}
		q.Tail = n
	}
	return q, nil
}

// MaxMessage bounds one exec message either way (the data of a message
// is cut to Chunk).
const (
	MaxMessage = 64 << 10
	Chunk      = 32 << 10
)

// ExecQuery is what /v1/exec takes besides the target and node.
type ExecQuery struct {
	Cmd           []string
	TTY, Stdin    bool
	Width, Height uint16
}

// Values encodes the query.
func (q ExecQuery) Values(v url.Values) {
	for _, c := range q.Cmd {
		v.Add("cmd", c)
	}
	if q.TTY {
		v.Set("tty", "1")
	}
	if q.Stdin {
		v.Set("stdin", "1")
	}
	if q.Width > 0 {
		v.Set("w", strconv.Itoa(int(q.Width)))
		v.Set("h", strconv.Itoa(int(q.Height)))
	}
}

func ParseExecQuery(v url.Values) (ExecQuery, error) {
	q := ExecQuery{Cmd: v["cmd"], TTY: v.Get("tty") == "1", Stdin: v.Get("stdin") == "1"}
	if len(q.Cmd) == 0 {
		return q, errors.New("no command: mesh exec MODULE.CONTAINER -- CMD...")
	}
	if s := v.Get("w"); s != "" {
		w, err1 := strconv.ParseUint(s, 10, 16)
		h, err2 := strconv.ParseUint(v.Get("h"), 10, 16)
		if err1 != nil || err2 != nil {
			return q, fmt.Errorf("bad window size %s x %s", s, v.Get("h"))
		}
		q.Width, q.Height = uint16(w), uint16(h)
	}
	return q, nil
}

// ErrorBody is the message of an error answer.
func ErrorBody(resp *http.Response) string {
	var e struct {
		Error string `json:"error"`
	}
	b := make([]byte, 4096)
	n, _ := resp.Body.Read(b)
	if json.Unmarshal(b[:n], &e) == nil && e.Error != "" {
		return e.Error
	}
	return fmt.Sprintf("%s: %s", resp.Status, b[:n])
}

// targetQuery names what logs and exec read: MODULE[.NAME], on node.
func targetQuery(target, node string) url.Values {
	v := url.Values{}
	v.Set("target", target)
	if node != "" {
		v.Set("node", node)
	}
	return v
}

// Logs reads /v1/logs (mesh logs) and calls each per record, until the stream ends or
// ctx does.
func (c *Client) Logs(ctx context.Context, target, node string, q LogQuery, each func(Record) error) error {
	hc := c.Streams()
	v := targetQuery(target, node)
	q.Values(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://mesh/v1/logs?"+v.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("ask the local agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(ErrorBody(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), MaxRecord)
	for sc.Scan() {
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return fmt.Errorf("the agent sent a bad record: %w", err)
		}
		if err := each(rec); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("the stream from the local agent broke: %w", err)
	}
	return nil
}

// ExecStreams are the caller's ends of an exec.
type ExecStreams struct {
	Stdin          io.Reader // nil: none
	Stdout, Stderr io.Writer
	// Resizes, when set, carries the terminal's new sizes.
	Resizes <-chan [2]uint16
}

// Exec runs q.Cmd (mesh exec) in target through /v1/exec and returns how it ended.
func (c *Client) Exec(ctx context.Context, target, node string, q ExecQuery, st ExecStreams) (Exit, error) {
	hc := c.Streams()
	v := targetQuery(target, node)
	q.Values(v)
	ws, resp, err := websocket.Dial(ctx, "http://mesh/v1/exec?"+v.Encode(), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return Exit{}, errors.New(ErrorBody(resp))
		}
		return Exit{}, fmt.Errorf("ask the local agent: %w", err)
	}
	ws.SetReadLimit(MaxMessage)
	defer ws.CloseNow()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if st.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, Chunk+1)
			for {
				buf[0] = KindStdin
				n, err := st.Stdin.Read(buf[1:])
				if n > 0 {
					if ws.Write(ctx, websocket.MessageBinary, buf[:1+n]) != nil {
						return
					}
				}
				if err != nil {
					ws.Write(ctx, websocket.MessageBinary, []byte{KindStdinEOF})
					return
				}
			}
		}()
	}
	if st.Resizes != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case sz := <-st.Resizes:
					ws.Write(ctx, websocket.MessageBinary, ResizeMessage(sz[0], sz[1]))
				}
			}
		}()
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return Exit{}, ctx.Err()
			}
			return Exit{}, fmt.Errorf("the exec stream ended before the command did: %w", err)
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case KindStdout:
			st.Stdout.Write(b[1:])
		case KindStderr:
			st.Stderr.Write(b[1:])
		case KindExit:
			var e Exit
			if err := json.Unmarshal(b[1:], &e); err != nil {
				return Exit{}, fmt.Errorf("the agent sent a bad exit: %w", err)
			}
			ws.Close(websocket.StatusNormalClosure, "")
			return e, nil
		}
	}
}
