//go:build !linux

package netsim

import "syscall"

// tcpSegmentOption is a no-op off Linux: TCPReadBuffer is then applied
// after the connection is set up (see tcp.go).
func tcpSegmentOption(int) func(network, address string, c syscall.RawConn) error { return nil }
