// Package capacity is the capacity model of docs/capacity.md: how many
// daemons, how large a database and how busy an object store a fleet of N
// agents needs, built from measured per-agent and per-operation costs.
//
// The inputs (Inputs, docs/perf/capacity-inputs.json) are the fleet-scale
// ladder (daemon RSS and CPU per agent, cold-start registration times;
// docs/perf.md §10) and the authority group-commit benchmark (operations
// per second per store, docs/perf.md §11), each with its provenance;
// `go run ./internal/tools/capacity/cmd/capacity import` rebuilds them from
// fresh measurements (`make capacity-inputs`).
//
// Model.Evaluate computes, for a Workload on k daemons (Deployment), the
// load on every resource — per daemon: memory, CPU, connections, file
// descriptors, heartbeats, re-registration time after a restart, network;
// shared: the authority database (the operations' rates against their
// measured ceilings, SQL statements and row writes counted from
// semantics/authority, the database's size from the schema) and the object
// store (bytes and requests). Model.Size finds the least k and the resource
// that bounds first. Fit is the linear per-agent fit the model uses, and
// TestLadderLeaveOneOut checks it against the ladder points it was not
// fitted on. Model.Simulate is a deterministic discrete-event simulation of
// the database load (steady phases or a restart herd).
//
// The package uses only the standard library: the command and the tests
// read the loadgen's and the benchmarks' outputs as text or JSON.
package capacity
