package netsim

import (
	"syscall"
)

// tcpSegmentOption sets SO_RCVBUF to rcvbuf and caps the MSS at
// tcpSegment on a socket before it connects or listens, so that a sender
// facing the proxy uses WAN-sized segments: with loopback's 64 KiB MSS a
// small receive buffer could not hold one segment and TCP would fall back
// to its 200 ms persist timer.
func tcpSegmentOption(rcvbuf int) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf); serr != nil {
				return
			}
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, tcpSegment)
		})
		if err != nil {
			return err
		}
		return serr
	}
}
