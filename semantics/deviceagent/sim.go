package deviceagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"forgeyard.dev/transport/wire/device"
)

// MaxSimArtifact bounds the artifact SimDriver installs.
const MaxSimArtifact = 1 << 20

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Errors of SimDriver.
var (
	ErrNoDevice      = errors.New("deviceagent: no such device")
	ErrNotInstalled  = errors.New("deviceagent: nothing installed")
	ErrBadArtifact   = errors.New("deviceagent: artifact is not a test list")
	ErrSuiteNotFound = errors.New("deviceagent: the artifact has no such suite")
)

// SimDriver is a simulated DeviceDriver. An artifact is text: a line
// "suite <name>" starts a suite, and each "test <name> pass|fail" line below
// it is a test. A run logs one line per test ("PASS <name>", "FAIL <name>")
// and counts them; a filter keeps the tests whose name contains it. Safe
// for concurrent use.
type SimDriver struct {
	mu       sync.Mutex
	devs     map[device.DeviceId]*simDevice
	installs int
	resets   int
}

type simDevice struct {
	info      Device
	installed map[string][]simTest // suite → tests
}

type simTest struct {
	name string
	pass bool
}

// NewSimDriver returns a driver with devs attached.
func NewSimDriver(devs ...Device) *SimDriver {
	s := &SimDriver{devs: map[device.DeviceId]*simDevice{}}
	for _, d := range devs {
		s.Add(d)
	}
	return s
}

// Add attaches (or replaces) a device.
func (s *SimDriver) Add(d Device) {
	s.mu.Lock()
	s.devs[d.ID] = &simDevice{info: d}
	s.mu.Unlock()
}

// Remove detaches a device.
func (s *SimDriver) Remove(id device.DeviceId) {
	s.mu.Lock()
	delete(s.devs, id)
	s.mu.Unlock()
}

// Installed returns the suites installed on id.
func (s *SimDriver) Installed(id device.DeviceId) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.devs[id]
	if d == nil {
		return nil
	}
	var out []string
	for k := range d.installed {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Discover implements DeviceDriver.
func (s *SimDriver) Discover(context.Context) ([]Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Device, 0, len(s.devs))
	for _, d := range s.devs {
		out = append(out, d.info)
	}
	slices.SortFunc(out, func(a, b Device) int { return strings.Compare(string(a.ID), string(b.ID)) })
	return out, nil
}

func (s *SimDriver) dev(id device.DeviceId) (*simDevice, error) {
	d := s.devs[id]
	if d == nil {
		return nil, ErrNoDevice
	}
	return d, nil
}

// Reserve implements DeviceDriver.
func (s *SimDriver) Reserve(_ context.Context, id device.DeviceId) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.dev(id)
	return err
}

// Install implements DeviceDriver: it parses the artifact's suites.
func (s *SimDriver) Install(_ context.Context, id device.DeviceId, r io.Reader) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSimArtifact+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxSimArtifact {
		return "", ErrBadArtifact
	}
	suites := map[string][]simTest{}
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case f[0] == "suite" && len(f) == 2:
			cur = f[1]
			suites[cur] = suites[cur][:0:0]
		case f[0] == "test" && len(f) == 3 && cur != "" && (f[2] == "pass" || f[2] == "fail"):
			suites[cur] = append(suites[cur], simTest{name: f[1], pass: f[2] == "pass"})
		default:
			return "", ErrBadArtifact
		}
	}
	if len(suites) == 0 {
		return "", ErrBadArtifact
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.dev(id)
	if err != nil {
		return "", err
	}
	d.installed = suites
	s.installs++
	n := 0
	for _, t := range suites {
		n += len(t)
	}
	return fmt.Sprintf("installed %d suites, %d tests", len(suites), n), nil
}

// RunTest implements DeviceDriver.
func (s *SimDriver) RunTest(ctx context.Context, id device.DeviceId, run TestRun) (TestResult, error) {
	s.mu.Lock()
	d, err := s.dev(id)
	var tests []simTest
	if err == nil {
		if d.installed == nil {
			err = ErrNotInstalled
		} else if t, ok := d.installed[run.Suite]; !ok {
			err = ErrSuiteNotFound
		} else {
			tests = slices.Clone(t)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return TestResult{}, err
	}
	var res TestResult
	fmt.Fprintf(run.Log, "running suite %s on %s\n", run.Suite, id)
	for _, t := range tests {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if run.Filter != "" && !strings.Contains(t.name, run.Filter) {
			continue
		}
		if t.pass {
			res.Passed++
			fmt.Fprintf(run.Log, "PASS %s\n", t.name)
		} else {
			res.Failed++
			fmt.Fprintf(run.Log, "FAIL %s\n", t.name)
		}
	}
	fmt.Fprintf(run.Log, "%d passed, %d failed\n", res.Passed, res.Failed)
	return res, nil
}

// Reset implements DeviceDriver: it uninstalls.
func (s *SimDriver) Reset(_ context.Context, id device.DeviceId) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.dev(id)
	if err != nil {
		return err
	}
	d.installed = nil
	s.resets++
	return nil
}
