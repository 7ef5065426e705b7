package yamux

import (
	"syscall"

	"golang.org/x/sys/unix"
)

func setNotSentLowat(raw syscall.RawConn, v int) error {
	var serr error
	err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, v)
	})
	if err != nil {
		return err
	}
	return serr
}

// notSentBytes returns the socket's unsent bytes (tcpi_notsent_bytes), or 0.
func notSentBytes(raw syscall.RawConn) int {
	if raw == nil {
		return 0
	}
	n := 0
	_ = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			n = int(info.Notsent_bytes)
		}
	})
	return n
}
