package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	agentwire "forgeyard.dev/transport/wire/agent"
)

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// size formats a byte count in KiB or MiB.
func size(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// print writes the human-readable summary.
func (r *report) print(w io.Writer) {
	daemon := "quic://" + r.DaemonQUIC + " + yamux://" + r.DaemonYamux
	if r.DaemonWT != "" {
		daemon += " + webtransport://" + r.DaemonWT
	}
	fmt.Fprintf(w, "\nForgeyard Transport demo — %d agents, daemon %s, %.1f s\n\n", len(r.Agents), daemon, r.Elapsed.Seconds())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tBACKEND\tPATH\tDAEMON SEES\tATTEMPTS\tACKS (ok/dup/stale)\tRECONNECTS\tRESYNCS\tCOMPLETION RETRIES")
	for _, a := range r.Agents {
		path := a.Path
		if a.Cut {
			path += " (cut)"
		}
		backend := a.Backend
		seen := a.DaemonSide
		if seen == "" {
			seen = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%d\t%d\t%d\n", a.Name, backend, path, seen, a.Attempts,
			a.Completions[agentwire.AckAccepted], a.Completions[agentwire.AckDuplicateAccepted], a.Completions[agentwire.AckStaleRejected],
			a.Reconnects, a.Resyncs, a.Retried)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, a := range r.Agents {
		fmt.Fprintf(w, "Agent %s is runner %s\n", a.Name, a.Runner)
	}
	if r.Relay != "" {
		rs := r.RelayStats
		fmt.Fprintf(w, "Relay yamux://%s → daemon quic://%s: %d agent connection(s) relayed, %d streams, %s to the daemon, %s to agents, %d dial failures\n",
			r.Relay, r.DaemonQUIC, rs.Accepted, rs.Streams, size(rs.BytesToDaemon), size(rs.BytesToAgent), rs.DialFailures)
		fmt.Fprintf(w, "      (the relay's TLS ends at the relay; the daemon checked the agent's own certificate chain and key proof)\n")
	}

	s := r.Stats
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Leases offered / accepted / rejected\t%d / %d / %d\n", s.LeasesOffered, s.LeasesAccepted, s.LeasesRejected)
	fmt.Fprintf(tw, "Attempts completed (authority)\t%d of %d, each exactly once: %v\n", r.ExactlyOnce, r.Attempts, r.ExactlyOnce == r.Attempts && r.Attempts > 0)
	if len(r.Rejections) > 0 || r.NotConnected > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(r.Rejections)) {
			parts = append(parts, fmt.Sprintf("%d %s", r.Rejections[k], k))
		}
		if r.NotConnected > 0 {
			parts = append(parts, fmt.Sprintf("%d offers deferred while the runner reconnected", r.NotConnected))
		}
		fmt.Fprintf(tw, "Retried offers\t%s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(tw, "Completions by ack\tAccepted %d, DuplicateAccepted %d, StaleRejected %d, InvalidRejected %d\n",
		s.Completions[agentwire.AckAccepted], s.Completions[agentwire.AckDuplicateAccepted], s.Completions[agentwire.AckStaleRejected], s.Completions[agentwire.AckInvalidRejected])
	var dupOffers int64
	for _, a := range r.Agents {
		dupOffers += a.DupOffers
	}
	fmt.Fprintf(tw, "Duplicates absorbed\tcompletion retries answered DuplicateAccepted: %d; duplicate offers: %d; duplicate lease answers: %d\n",
		s.Completions[agentwire.AckDuplicateAccepted], dupOffers, s.DuplicateAnswers)
	fmt.Fprintf(tw, "Reconnects / resyncs (daemon)\t%d / %d\t(every registration resyncs; reconnects keep their agent session)\n", s.Reconnects, s.Resyncs)
	fmt.Fprintf(tw, "Fenced transports\t%d\n", s.Fenced)
	tw.Flush()

	if r.CutDuplicate {
		fmt.Fprintf(w, "\nCut: agent %s's path was cut right after the daemon committed the completion of attempt %s\n", r.Agents[0].Name, r.CutAttempt)
		fmt.Fprintf(w, "     (MessageId %s), so the ack was lost. %.2f s later the agent had reconnected under the same\n", r.CutMessage, r.CutRecovery.Seconds())
		fmt.Fprintf(w, "     agent session, resynced, and re-sent the completion with the same MessageId: DuplicateAccepted.\n")
	}
	if r.CD.N > 0 || r.CancelResult == agentwire.ResultCancelled {
		fmt.Fprintf(w, "Cancel: attempt %s was cancelled while running (its log was tailed live: %d lines); it ended %v.\n", r.CancelAttempt, r.Data.TailLines, r.CancelResult)
	}
	dr := r.Data
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Logs\t%d frames, %.1f KiB durable at the daemon (sequenced, resumed after cuts, finalized before each completion)\n", dr.LogFrames, float64(dr.LogBytes)/1024)
	fmt.Fprintf(tw, "Payload (CAS download)\t%d downloads served; %d attempts started with the verified payload (%d failed)\n", dr.Downloads, dr.PayloadsVerified, dr.PayloadsFailed)
	fmt.Fprintf(tw, "Outputs (CAS upload)\t%d uploaded and verified (+%d already held); %d/%d claimed outputs in the daemon's store\n", dr.Uploads, dr.Deduplicated, dr.Stored, dr.Claimed)
	if dr.CutAt > 0 {
		fmt.Fprintf(tw, "Cut upload\t%d MiB output cut at %.1f MiB; resumed %d time(s) from the verified prefix, %.1f MiB not re-sent; stored and verified: %v\n",
			bigOutputSize>>20, float64(dr.CutAt)/(1<<20), dr.Resumed, float64(dr.ResumedPrefix)/(1<<20), dr.BigStored)
	}
	if rr := r.Roles; rr.SignedBy != "" {
		fmt.Fprintf(tw, "Signing worker	key %s signed a digest over the payload; signature verified: %v; unattested request refused: %s\n",
			rr.SignKey, rr.SignatureVerified, rr.RefusedCode)
	}
	if rr := r.Roles; rr.DeviceRunner != "" {
		fmt.Fprintf(tw, "Device agent	artifact installed from CAS; suite smoke %d passed, %d failed, %d log lines streamed; stale reservation refused: %v\n",
			rr.DevicePassed, rr.DeviceFailed, rr.DeviceLogLines, rr.StaleRefused)
	}
	tw.Flush()

	fmt.Fprintf(w, "\n%-22s %4s %11s %11s\n", "LATENCY (daemon side)", "N", "P50", "P99")
	for _, l := range []struct {
		name string
		s    latStat
	}{{"offer → accept", r.OfferAccept}, {"completion → ack", r.ComplAck}, {"cancel delivery", r.CD}} {
		fmt.Fprintf(w, "%-22s %4d %11s %11s\n", l.name, l.s.N, ms(l.s.P50), ms(l.s.P99))
	}
	fmt.Fprintf(w, "(loopback plus the proxies' latency; offers to the cut agent wait for its reconnect, hence the offer p99)\n")

	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\nAuthority check: %d/%d accepted attempts completed exactly once — %s\n", r.ExactlyOnce, r.Attempts, verdict)
	fmt.Fprintf(w, "State kept in %s (dev certificates are reused next time; the authority starts fresh).\n", strings.TrimSuffix(r.Dir, "/"))
}
