// Package deviceagent is the device agent (§100, §191): a peer that
// registers with the device role and serves the device family — discover,
// reserve, install, run test, reset — on the devices a DeviceDriver
// manages. Nothing else reaches it: the agent endpoint it runs on
// (agent.Config.Service) refuses execution messages and other families
// with RoleForbidden, and a device operation names a device, a lease, an
// artifact digest or a suite, never a command line.
//
// Reservations are fenced like leases: a device is held by one lease at a
// time until its reservation expires or it is reset; install, run test and
// reset under any other lease are refused (OutcomeBusy while another lease
// holds the device, OutcomeFailed when none does), as are reservations by
// another lease. Reserving again under the holding lease renews.
//
// Install downloads the artifact from the daemon's CAS on the request's
// connection (cas.Downloader: the digest is verified before the object is
// committed; the daemon allows exactly that artifact, §93) and hands it to
// the driver. A test run streams its log to the daemon while it runs: a log
// stream (§43) whose LogStreamHeaderV1 names the reservation's lease (its
// attempt is the lease's ULID: a device run has no job attempt of its own),
// raw LogFrameV1 frames, closed before the RunTestResultV1 is sent. Runs
// answered Ok, Failed or Timeout always stream a log, possibly empty (the
// daemon waits for it); when the log stream cannot be opened the suite is
// not run and the answer is NotFound.
//
// SimDriver is a simulated driver for tests and the demo: devices appear
// and disappear (Add, Remove), an installed artifact is a text file of
// "test <name> pass|fail" lines, and a run reports each test on its log.
package deviceagent
