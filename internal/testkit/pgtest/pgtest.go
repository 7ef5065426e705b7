// Package pgtest starts a throwaway PostgreSQL server for tests: Debian's
// package binaries, a fresh data directory under the system temp dir, a free
// loopback port, trust authentication, fsync off (StartWith(Options{Durable:
// true}) for PostgreSQL's default durability). Each test gets its own
// database. When FORGEYARD_PG_DSN is set, that server is used instead.
//
// `make test` installs the postgresql package if it is missing
// (.ci/ensure-debs.sh). Without it, Start fails with an actionable message;
// tests never skip silently.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"forgeyard.dev/transport/internal/testkit/sharedsrv"
)

// Server is a running PostgreSQL server.
type Server struct {
	dir    string // data dir ("" for an external server)
	bin    string
	runAs  string // "" or the unprivileged user the server runs as
	admin  string // DSN of the maintenance database
	host   string
	port   int
	dbSeq  atomic.Int64
	stopMu sync.Mutex

	durable bool // StartWith's Options.Durable, kept for Restart
	down    bool // StopServer stopped it; Restart starts it again
}

var shared = sharedsrv.New("pgtest", Start, (*Server).Stop)

// Shared starts one server per test binary on first use. Call StopShared
// from TestMain after m.Run.
func Shared(t testing.TB) *Server {
	t.Helper()
	return shared.Get(t)
}

// StopShared stops the server started by Shared, if any.
func StopShared() { shared.Stop() }

func findBin() (string, error) {
	if d := os.Getenv("FORGEYARD_PG_BIN"); d != "" {
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		if p, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", errors.New("PostgreSQL server binaries not found (looked in /usr/lib/postgresql/*/bin and PATH); " +
			"run `make deps` or `apt-get install -y postgresql`, or set FORGEYARD_PG_DSN")
	}
	sort.Strings(matches)
	return filepath.Dir(matches[len(matches)-1]), nil
}

// Options configure StartWith.
type Options struct {
	// Durable runs the server with PostgreSQL's (and Debian's packaged)
	// default durability: fsync, synchronous_commit and full_page_writes on,
	// so every commit waits for its WAL flush. Without it the server runs
	// with fsync off, which suits functional tests but hides the cost of a
	// commit; benchmarks of commit throughput use Durable. The data
	// directory is under the system temp dir, which must be a real disk
	// (not tmpfs) for the figures to mean anything.
	Durable bool
}

// Start starts a new server (or connects to FORGEYARD_PG_DSN) with fsync off.
func Start() (*Server, error) { return StartWith(Options{}) }

// StartWith starts a new server configured by o (or connects to
// FORGEYARD_PG_DSN, whose configuration is the operator's).
func StartWith(o Options) (*Server, error) {
	if dsn := os.Getenv("FORGEYARD_PG_DSN"); dsn != "" {
		s := &Server{admin: dsn}
		return s, s.ping()
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, host: "127.0.0.1"}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root; use the package's system user.
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, errors.New("running as root but no 'postgres' user exists to run the server; install Debian's postgresql package")
		}
		s.runAs = "postgres"
	}
	s.dir, err = os.MkdirTemp("", "forgeyard-pg-")
	if err != nil {
		return nil, err
	}
	if s.runAs != "" {
		if err := exec.Command("chown", s.runAs, s.dir).Run(); err != nil {
			return nil, fmt.Errorf("chown data dir: %w", err)
		}
	}
	data := filepath.Join(s.dir, "data")
	if out, err := s.run("initdb", "-D", data, "-U", "forgeyard", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	s.durable = o.Durable
	for attempt := 0; attempt < 3; attempt++ {
		s.port, err = freePort()
		if err != nil {
			break
		}
		if err = s.startServer(); err == nil {
			break
		}
	}
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.admin = (&url.URL{Scheme: "postgres", User: url.User("forgeyard"), Host: net.JoinHostPort(s.host, strconv.Itoa(s.port)),
		Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	if err := s.ping(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// startServer runs pg_ctl start on s.dir's data directory and s.port.
func (s *Server) startServer() error {
	opts := "-p " + strconv.Itoa(s.port) + " -h 127.0.0.1 -k " + s.dir + " -c max_connections=200"
	if s.durable {
		opts += " -c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	} else {
		opts += " -F -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	out, err := s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-o", opts, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	return nil
}

// StopServer stops the running server without removing its data (an
// outage): every connection is cut and new ones are refused until
// StartServer. mode is pg_ctl's shutdown mode: "fast" (roll back open
// transactions, checkpoint) or "immediate" (abort, as a crash: recovery
// replays the WAL at the next start). The server's own PostgreSQL only;
// an external FORGEYARD_PG_DSN server cannot be stopped (error).
func (s *Server) StopServer(mode string) error {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.dir == "" {
		return errors.New("pgtest: cannot stop an external (FORGEYARD_PG_DSN) or removed server")
	}
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pgtest: shutdown mode %q: want fast or immediate", mode)
	}
	if s.down {
		return nil
	}
	if out, err := s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	s.down = true
	return nil
}

// StartServer starts a server StopServer stopped: the same data directory
// and the same port, so DSNs handed out before stay valid. It returns once
// the server accepts connections.
func (s *Server) StartServer() error {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.dir == "" {
		return errors.New("pgtest: cannot start an external (FORGEYARD_PG_DSN) or removed server")
	}
	if !s.down {
		return nil
	}
	if err := s.startServer(); err != nil {
		return err
	}
	s.down = false
	return s.ping()
}

func (s *Server) run(tool string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, tool)
	var cmd *exec.Cmd
	if s.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) ping() error {
	db, err := sql.Open("pgx", s.admin)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// NewDatabase creates a fresh database for one test and returns its DSN.
// The database is dropped when the test ends.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("fy_%d_%d", os.Getpid(), s.dbSeq.Add(1))
	db, err := sql.Open("pgx", s.admin)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	u, err := url.Parse(s.admin)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.Path = "/" + name
	t.Cleanup(func() {
		db, err := sql.Open("pgx", s.admin)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
	})
	return u.String()
}

// Stop stops the server and removes its data directory.
func (s *Server) Stop() {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.dir == "" {
		return
	}
	_, _ = s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
		s.dir = ""
	}
}
