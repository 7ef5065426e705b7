package quic

import (
	"net"

	"golang.org/x/sys/unix"
)

// growReceiveBuffer asks for an n-byte SO_RCVBUF on a listener's socket:
// SO_RCVBUFFORCE first (beyond net.core.rmem_max, with CAP_NET_ADMIN),
// else SO_RCVBUF (capped by rmem_max). Errors are ignored: quic-go's own
// 7 MiB request and checkUDPBuffers' warning still apply.
func growReceiveBuffer(c *net.UDPConn, n int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if cur, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF); err == nil && cur >= n {
			return
		}
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n)
		}
	})
}
