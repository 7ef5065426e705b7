package cli

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"
)

// AdminServer is a running admin HTTP endpoint (/metrics, /healthz and
// whatever else a command serves), bounded like every operator endpoint:
// 5 s to read a request header, 10 s the request, 30 s to write, 1 min
// idle, 16 KiB of header; server errors go to the log at Warn.
type AdminServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
	sock string // unix socket path to remove at Stop
}

// ListenAdmin listens on the TCP addr (already checked by
// config.AdminAddr) and serves h.
func ListenAdmin(addr string, h http.Handler, log *slog.Logger) (*AdminServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return ServeAdmin(ln, "", h, log), nil
}

// ServeAdmin serves h on ln. sock, when not "", is the unix socket path
// ln is bound to: Stop removes it.
func ServeAdmin(ln net.Listener, sock string, h http.Handler, log *slog.Logger) *AdminServer {
	a := &AdminServer{ln: ln, sock: sock, done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() {
		err := a.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.done <- err
	}()
	return a
}

// Addr is the bound address (or the socket path).
func (a *AdminServer) Addr() string { return a.ln.Addr().String() }

// Stop shuts the server down, waiting up to timeout for requests in
// flight (then closing them), and removes the unix socket.
func (a *AdminServer) Stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.done
	if a.sock != "" {
		_ = os.Remove(a.sock)
	}
}
