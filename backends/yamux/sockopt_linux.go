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

// notSentBytes returns the socket's unsent bytes, or 0: ioctl SIOCOUTQNSD,
// the same figure as TCP_INFO's tcpi_notsent_bytes (write_seq − snd_nxt)
// without filling the whole tcp_info (the scheduler reads it before every
// bulk chunk; getsockopt(TCP_INFO) was 10 % of a bulk stream's CPU profile).
func notSentBytes(raw syscall.RawConn) int {
	if raw == nil {
		return 0
	}
	n := 0
	_ = raw.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD)
		if err == nil && v > 0 {
			n = v
		}
	})
	return n
}
