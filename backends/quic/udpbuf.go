package quic

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// quic-go v0.64.1 asks for 7 MiB UDP receive and send buffers
// (desiredBufferSize in sys_conn_buffers_nonopenbsd.go) and complains when
// the socket ends up with less. Linux doubles the requested value for
// bookkeeping and caps the request at net.core.{r,w}mem_max, so the
// request succeeds without privileges when rmem_max/wmem_max ≥ 3.5 MiB.
const (
	wantedUDPBuffer = 7 << 20
	// UDPBufferFix is the command that gives quic-go its buffers.
	UDPBufferFix = "sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000"

	quicGoWarningEnv = "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING"
)

var (
	udpWarnOnce    sync.Once
	udpPrepareOnce sync.Once
)

// UDPBufferAdvice reports whether this host lets quic-go raise its UDP
// socket buffers to what it wants (7 MiB each way), from
// /proc/sys/net/core/rmem_max and wmem_max. When !ok, advice explains the
// numbers and names the fix (UDPBufferFix). On systems without those files
// (not Linux) it returns ok=true and an explanatory advice. For `doctor`.
func UDPBufferAdvice() (ok bool, advice string) {
	rmem, rerr := readProcInt("/proc/sys/net/core/rmem_max")
	wmem, werr := readProcInt("/proc/sys/net/core/wmem_max")
	if rerr != nil || werr != nil {
		return true, "UDP buffer limits unknown on this system (no /proc/sys/net/core/{r,w}mem_max); nothing to check"
	}
	return udpBufferAdvice(rmem, wmem)
}

// udpBufferAdvice decides from the two sysctl values.
func udpBufferAdvice(rmem, wmem int) (bool, string) {
	// The kernel doubles min(request, *mem_max); quic-go compares that
	// doubled value with 7 MiB.
	need := wantedUDPBuffer / 2
	if rmem >= need && wmem >= need {
		return true, fmt.Sprintf("UDP buffers ok: net.core.rmem_max=%d, wmem_max=%d (quic-go wants %d KiB socket buffers)",
			rmem, wmem, wantedUDPBuffer>>10)
	}
	return false, fmt.Sprintf("UDP buffers too small for QUIC throughput: net.core.rmem_max=%d, wmem_max=%d, "+
		"quic-go wants %d KiB socket buffers; fix: %s (persist it in /etc/sysctl.d/)",
		rmem, wmem, wantedUDPBuffer>>10, UDPBufferFix)
}

func readProcInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// prepareUDPBufferWarning silences quic-go's own log.Printf about buffers
// (unless the operator set the variable), because checkUDPBuffers logs the
// one slog warning with the fix instead.
func prepareUDPBufferWarning() {
	udpPrepareOnce.Do(func() {
		if _, set := os.LookupEnv(quicGoWarningEnv); !set {
			_ = os.Setenv(quicGoWarningEnv, "true")
		}
	})
}

// checkUDPBuffers inspects the socket after quic-go tried to raise its
// buffers and logs ONE warning per process when they are still short.
func checkUDPBuffers(c *net.UDPConn, log *slog.Logger) {
	rcv, snd, err := socketBuffers(c)
	if err != nil || (rcv >= wantedUDPBuffer && snd >= wantedUDPBuffer) {
		return
	}
	udpWarnOnce.Do(func() {
		_, advice := UDPBufferAdvice()
		log.Warn("quic: UDP socket buffers are smaller than quic-go wants; throughput will suffer",
			"rcvbuf", rcv, "sndbuf", snd, "wanted", wantedUDPBuffer, "fix", UDPBufferFix, "detail", advice)
	})
}
