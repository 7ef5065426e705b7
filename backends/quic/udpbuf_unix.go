//go:build unix

package quic

import (
	"net"

	"golang.org/x/sys/unix"
)

// socketBuffers returns SO_RCVBUF and SO_SNDBUF of c.
func socketBuffers(c *net.UDPConn) (rcv, snd int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		rcv, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if serr == nil {
			snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}
	}); err != nil {
		return 0, 0, err
	}
	return rcv, snd, serr
}
