//go:build !linux

package yamux

import (
	"errors"
	"syscall"
)

func setNotSentLowat(syscall.RawConn, int) error {
	return errors.New("TCP_NOTSENT_LOWAT is not supported on this platform")
}

func notSentBytes(syscall.RawConn) int { return 0 }
