//go:build !linux

package quic

import "net"

// growReceiveBuffer is Linux's SO_RCVBUFFORCE; elsewhere quic-go's own
// request applies.
func growReceiveBuffer(*net.UDPConn, int) {}
