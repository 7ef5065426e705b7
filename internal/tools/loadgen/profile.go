package loadgen

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"
)

// profiling is how the loadgen takes the daemon's runtime profiles
// (Options.Profile): the daemon serves /debug/pprof/ (--admin-pprof) on an
// admin unix socket of its own (--admin-socket), which needs no token.
type profiling struct {
	sock string
	http *http.Client
}

// maxSocketPath is the longest unix socket path the daemon accepts
// (admin.socket).
const maxSocketPath = 104

// newProfiling returns the daemon arguments that enable the profiles and
// the client that fetches them, or an error when dir is too deep for a
// unix socket path.
func newProfiling(dir string) (*profiling, []string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(abs, "admin.sock")
	if len(sock) > maxSocketPath {
		return nil, nil, fmt.Errorf("loadgen: --profile: the admin socket path %s is longer than %d bytes; use a shorter --dir", sock, maxSocketPath)
	}
	p := &profiling{sock: sock, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}}
	return p, []string{"--admin-pprof", "--admin-socket", sock}, nil
}

// collect makes the daemon run two garbage collections (the heap profile's
// gc=1), so that the heap read next is the live heap. A nil p (no
// --profile: no admin socket) does nothing.
func (p *profiling) collect(ctx context.Context) {
	if p == nil {
		return
	}
	// Twice, as the raw server does: the first collection moves sync.Pool
	// contents (quic-go's packet buffers) to the victim cache, the second
	// frees them.
	for range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://daemon/debug/pprof/heap?gc=1", nil)
		if err != nil {
			return
		}
		if resp, err := p.http.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}
}

// fetch writes the profile at path (e.g. "profile?seconds=20", "heap")
// to file.
func (p *profiling) fetch(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://daemon/debug/pprof/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("loadgen: GET /debug/pprof/%s: %s: %s", path, resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// maxCPUProfile keeps a CPU profile under the admin server's 30 s write
// timeout.
const maxCPUProfile = 25 * time.Second

// cpu starts a CPU profile of d seconds written to file; the returned
// channel yields its outcome.
func (p *profiling) cpu(ctx context.Context, d time.Duration, file string) <-chan error {
	d = min(max(d, time.Second), maxCPUProfile)
	done := make(chan error, 1)
	go func() {
		done <- p.fetch(ctx, fmt.Sprintf("profile?seconds=%d", int(d/time.Second)), file)
	}()
	return done
}

// profileSelf records the loadgen's own CPU profile (the fleet's side of
// the herd) for d, at most maxCPUProfile, in file; nil error on the
// channel when written. Only one CPU profile runs per process: a second
// concurrent call fails.
func profileSelf(ctx context.Context, d time.Duration, file string) <-chan error {
	d = min(max(d, time.Second), maxCPUProfile)
	done := make(chan error, 1)
	f, err := os.Create(file)
	if err != nil {
		done <- err
		return done
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		done <- err
		return done
	}
	go func() {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pprof.StopCPUProfile()
		done <- f.Close()
	}()
	return done
}

// selfCPU is the loadgen process's CPU seconds so far (-1 when unknown).
func selfCPU() float64 {
	ps, err := ReadProc(os.Getpid())
	if err != nil {
		return -1
	}
	return ps.CPUSeconds
}
