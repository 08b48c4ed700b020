package operate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/coder/websocket"

	"mesh/podman"
)

// The CLI's side: hc is a client of the local API's socket with no overall
// timeout.

// Logs reads /v1/logs and calls each per record, until the stream ends or
// ctx does.
func Logs(ctx context.Context, hc *http.Client, target, node string, q LogQuery, each func(Record) error) error {
	v := url.Values{}
	v.Set("target", target)
	if node != "" {
		v.Set("node", node)
	}
	q.values(v)
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
		return errors.New(errorBody(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8*podman.MaxLogLine)
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

// Exec runs q.Cmd in target through /v1/exec and returns how it ended.
func Exec(ctx context.Context, hc *http.Client, target, node string, q ExecQuery, st ExecStreams) (Exit, error) {
	v := url.Values{}
	v.Set("target", target)
	if node != "" {
		v.Set("node", node)
	}
	q.Values(v)
	ws, resp, err := websocket.Dial(ctx, "http://mesh/v1/exec?"+v.Encode(), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return Exit{}, errors.New(errorBody(resp))
		}
		return Exit{}, fmt.Errorf("ask the local agent: %w", err)
	}
	ws.SetReadLimit(maxMessage)
	defer ws.CloseNow()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if st.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunk+1)
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
					ws.Write(ctx, websocket.MessageBinary, Resize(sz[0], sz[1]))
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
