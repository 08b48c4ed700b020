package agent

import (
	"net"
	"os"
	"strings"
)

// sdNotify tells systemd (Type=notify) how the agent is: "READY=1" once it
// serves, "STOPPING=1" when it begins to stop. Without NOTIFY_SOCKET (not
// under systemd) it does nothing. The protocol is one datagram on a unix
// socket; an abstract socket's name starts with '@'.
func sdNotify(state string) error {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return nil
	}
	if strings.HasPrefix(sock, "@") {
		sock = "\x00" + sock[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
