//go:build !unix

package quic

import (
	"errors"
	"net"
)

// socketBuffers is not implemented here; no warning is logged.
func socketBuffers(*net.UDPConn) (rcv, snd int, err error) {
	return 0, 0, errors.New("not supported")
}
