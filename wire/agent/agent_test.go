package agent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// infoOf returns the registry entry of m's type.
func infoOf(t testing.TB, m wire.Message) *wire.MessageInfo {
	t.Helper()
	for i := range Messages {
		if Messages[i].Type == m.MessageType() {
			return &Messages[i]
		}
	}
	t.Fatalf("%T (%s) is not in Messages", m, m.MessageType())
	return nil
}

func nameOf(m wire.Message) string { return reflect.TypeOf(m).Elem().Name() }

// decodeAs decodes b into a fresh value of m's type and requires the whole
// input to be consumed.
func decodeAs(t testing.TB, m wire.Message, b []byte) (wire.Message, error) {
	t.Helper()
	out := infoOf(t, m).New()
	d := postcard.NewDecoder(b)
	out.DecodePostcard(&d)
	return out, d.Finish()
}

func TestSamplesRoundTrip(t *testing.T) {
	for i, m := range Samples() {
		if err := m.Validate(); err != nil {
			t.Errorf("sample %d %s: Validate: %v", i, nameOf(m), err)
		}
		enc := m.AppendPostcard(nil)
		got, err := decodeAs(t, m, enc)
		if err != nil {
			t.Errorf("sample %d %s: decode: %v\n%x", i, nameOf(m), err, enc)
			continue
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("sample %d %s: decoded value differs:\n got %#v\nwant %#v", i, nameOf(m), got, m)
		}
		if re := got.AppendPostcard(nil); !bytes.Equal(re, enc) {
			t.Errorf("sample %d %s: re-encoding differs:\n%x\n%x", i, nameOf(m), re, enc)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("sample %d %s: decoded value fails Validate: %v", i, nameOf(m), err)
		}
		// Appending after existing bytes must not disturb them.
		prefix := []byte{0xde, 0xad}
		if b := m.AppendPostcard(prefix); !bytes.Equal(b[:2], prefix) || !bytes.Equal(b[2:], enc) {
			t.Errorf("sample %d %s: AppendPostcard does not append", i, nameOf(m))
		}
	}
}

// Decoding into a value that already holds another sample must give the
// same result as decoding into a fresh one (no stale slice elements, Option
// values or variant fields survive).
func TestDecodeIntoReusedValue(t *testing.T) {
	samples := Samples()
	byType := map[wire.MessageTypeId][]wire.Message{}
	for _, m := range samples {
		byType[m.MessageType()] = append(byType[m.MessageType()], m)
	}
	for _, group := range byType {
		for _, a := range group {
			for _, b := range group {
				// dst first holds a (in its own slices), then b over it.
				dst := infoOf(t, a).New()
				d0 := postcard.NewDecoder(a.AppendPostcard(nil))
				dst.DecodePostcard(&d0)
				if !reflect.DeepEqual(dst, a) {
					t.Fatalf("%s: decode differs", nameOf(a))
				}
				d := postcard.NewDecoder(b.AppendPostcard(nil))
				dst.DecodePostcard(&d)
				if err := d.Finish(); err != nil {
					t.Fatalf("%s: %v", nameOf(b), err)
				}
				// Capacity is reused, so an empty list may come back empty
				// rather than nil; that is the only difference allowed.
				nilEmptySlices(reflect.ValueOf(dst).Elem())
				if !reflect.DeepEqual(dst, b) {
					t.Errorf("%s: decoding over a previous value left state behind:\n got %#v\nwant %#v", nameOf(b), dst, b)
				}
			}
		}
	}
}

// nilEmptySlices sets every empty slice reachable from v to nil.
func nilEmptySlices(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			nilEmptySlices(v.Field(i))
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.Zero(v.Type()))
		}
		for i := 0; i < v.Len(); i++ {
			nilEmptySlices(v.Index(i))
		}
	}
}

func TestRegistry(t *testing.T) {
	r, err := wire.NewRegistry(Messages)
	if err != nil {
		t.Fatal(err)
	}
	if len(Messages) != 29 {
		t.Errorf("Messages has %d entries, want 29 (0x01–0x1d)", len(Messages))
	}
	sampled := map[wire.MessageTypeId]bool{}
	for _, m := range Samples() {
		sampled[m.MessageType()] = true
		mi, ok := r.Lookup(m.MessageType())
		if !ok {
			t.Errorf("%s not registered", nameOf(m))
			continue
		}
		if want := "agent." + nameOf(m); mi.Name != want {
			t.Errorf("type %s registered as %q, want %q", mi.Type, mi.Name, want)
		}
		// Through the registry, as the transport decodes it.
		payload := wire.AppendMessage(nil, m)
		d := postcard.NewDecoder(payload)
		got, err := r.DecodeMessage(&d)
		if err != nil {
			t.Errorf("%s: registry decode: %v", nameOf(m), err)
		} else if !reflect.DeepEqual(got, m) {
			t.Errorf("%s: registry decode differs", nameOf(m))
		}
	}
	for _, mi := range Messages {
		if mi.Type.Family() != wire.FamilyAgent {
			t.Errorf("%s: family %s", mi.Name, mi.Type.Family())
		}
		// Certificate enrollment and renewal came after 1.0 and 1.1 shipped
		// (their vectors are frozen): protocol 1.2; so did the structured
		// retry hint (RegistrationDeferredV1, feature RetryAfterV1).
		want := wire.V(1, 0)
		if mi.Type == MsgCertificateRequest || mi.Type == MsgCertificateIssued || mi.Type == MsgRegistrationDeferred {
			want = wire.V(1, 2)
		}
		if mi.Type == MsgRestartToken { // restart tokens: protocol 1.3, feature RestartTokenV1
			want = wire.V(1, 3)
		}
		if mi.Since != want {
			t.Errorf("%s: Since %s, want %s", mi.Name, mi.Since, want)
		}
		if mi.Sensitive != (mi.Type == MsgSecretMaterial || mi.Type == MsgCertificateRequest) {
			t.Errorf("%s: Sensitive = %v", mi.Name, mi.Sensitive)
		}
		if !sampled[mi.Type] {
			t.Errorf("%s has no sample", mi.Name)
		}
		if mi.MaxSize <= 0 || mi.MaxSize > wire.MaxAnyFrame {
			t.Errorf("%s: MaxSize %d outside (0, %d]", mi.Name, mi.MaxSize, wire.MaxAnyFrame)
		}
	}
}

func TestSamplesDeterministicAndFresh(t *testing.T) {
	a, b := Samples(), Samples()
	if len(a) != len(b) {
		t.Fatal("Samples length varies")
	}
	enc := make([][]byte, len(a))
	for i := range a {
		enc[i] = a[i].AppendPostcard(nil)
		if !bytes.Equal(enc[i], b[i].AppendPostcard(nil)) {
			t.Errorf("sample %d %s differs between calls", i, nameOf(a[i]))
		}
	}
	// Scribble over every slice of the first call; the next call must not
	// see it.
	for _, m := range a {
		scribble(reflect.ValueOf(m).Elem())
	}
	for i, m := range Samples() {
		if !bytes.Equal(enc[i], m.AppendPostcard(nil)) {
			t.Errorf("sample %d %s shares memory between calls", i, nameOf(m))
		}
	}
}

func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			scribble(v.Field(i))
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			e := v.Index(i)
			if e.Kind() == reflect.Uint8 {
				e.SetUint(0xee)
			} else if e.Kind() == reflect.String {
				e.SetString("scribbled")
			} else {
				scribble(e)
			}
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			if e := v.Index(i); e.Kind() == reflect.Uint8 {
				e.SetUint(0xee)
			}
		}
	}
}

func TestSamplesCoverEnumVariants(t *testing.T) {
	seen := map[string]map[uint32]bool{}
	mark := func(enum string, v uint32) {
		if seen[enum] == nil {
			seen[enum] = map[uint32]bool{}
		}
		seen[enum][v] = true
	}
	markBool := func(enum string, v bool) {
		if v {
			mark(enum, 1)
		} else {
			mark(enum, 0)
		}
	}
	for _, m := range Samples() {
		switch m := m.(type) {
		case *TransportHelloV1:
			mark("PeerRole", uint32(m.Role))
			markBool("Option(agent_session)", m.HasAgentSession)
		case *RegisterAgentV1:
			markBool("Option(resume_epoch)", m.HasResumeEpoch)
		case *RegistrationRejectedV1:
			mark("RetryClass", uint32(m.Retry))
			markBool("Option(server_range)", m.HasServerRange)
		case *LeaseOfferV1:
			mark("DigestAlgorithm", uint32(m.PayloadRef.Algorithm))
		case *LeaseRejectedV1:
			mark("LeaseRejectReason", uint32(m.Reason))
		case *LeaseRenewV1:
			mark("AttemptPhase", uint32(m.ObservedPhase))
		case *LeaseRenewAckV1:
			mark("RenewOutcome", uint32(m.Outcome.Kind))
			if m.Outcome.Kind == RenewRevoked {
				mark("CancellationReason", uint32(m.Outcome.Reason))
			}
		case *CancelAttemptV1:
			mark("CancellationReason", uint32(m.Reason))
		case *PhaseChangeV1:
			mark("AttemptPhase", uint32(m.Phase))
		case *AttemptCompletionV1:
			mark("ExecutionResult", uint32(m.Result.Kind))
			for _, o := range m.Outputs {
				mark("DigestAlgorithm", uint32(o.Algorithm))
			}
		case *CompletionAckV1:
			mark("CompletionAckKind", uint32(m.Kind))
		case *HeartbeatV1:
			for _, a := range m.ActiveAttempts {
				mark("AttemptPhase", uint32(a.Phase))
			}
		case *AgentResyncV1:
			for _, a := range m.ActiveAttempts {
				mark("AttemptPhase", uint32(a.Phase))
				markBool("Option(completion)", a.HasCompletion)
			}
		case *ResyncResponseV1:
			for _, r := range m.Results {
				mark("ResyncDecision", uint32(r.Decision.Kind))
			}
		}
	}
	want := map[string]uint32{
		"PeerRole": numPeerRoles, "RetryClass": numRetryClasses, "DigestAlgorithm": 2,
		"LeaseRejectReason": numLeaseRejectReasons, "AttemptPhase": numPhases,
		"RenewOutcome": numRenewOutcomes, "CancellationReason": numCancellationReasons,
		"ExecutionResult": numExecutionResults, "CompletionAckKind": numCompletionAckKinds,
		"ResyncDecision":        numResyncDecisions,
		"Option(agent_session)": 2, "Option(resume_epoch)": 2, "Option(server_range)": 2, "Option(completion)": 2,
	}
	for enum, n := range want {
		for v := uint32(0); v < n; v++ {
			if !seen[enum][v] {
				t.Errorf("no sample carries %s variant %d", enum, v)
			}
		}
	}
}

func TestAppendPostcardZeroAllocs(t *testing.T) {
	buf := make([]byte, 0, maxSecretMaterialSize+1024)
	for _, m := range Samples() {
		allocs := testing.AllocsPerRun(50, func() { buf = m.AppendPostcard(buf[:0]) })
		if allocs != 0 {
			t.Errorf("%s: AppendPostcard allocates %.1f times", nameOf(m), allocs)
		}
	}
}

// Messages without strings decode into a reused value without allocating.
func TestDecodeReusedZeroAllocs(t *testing.T) {
	for _, m := range Samples() {
		switch m := m.(type) {
		case *HeartbeatV1, *LeaseOfferV1, *LeaseAcceptedV1, *LeaseRenewAckV1, *AgentResyncV1,
			*ResyncResponseV1, *HeartbeatAckV1, *LeaseProbeV1, *PhaseChangeV1:
			enc := m.AppendPostcard(nil)
			dst := infoOf(t, m).New()
			var d postcard.Decoder
			allocs := testing.AllocsPerRun(50, func() {
				d.Reset(enc)
				dst.DecodePostcard(&d)
			})
			if d.Err() != nil {
				t.Fatalf("%s: %v", nameOf(m), d.Err())
			}
			if allocs != 0 {
				t.Errorf("%s: decoding into a reused value allocates %.1f times", nameOf(m), allocs)
			}
		}
	}
}

func TestTruncatedInputFails(t *testing.T) {
	for _, m := range Samples() {
		enc := m.AppendPostcard(nil)
		for n := 0; n < len(enc); n++ {
			_, err := decodeAs(t, m, enc[:n])
			var pe *postcard.Error
			if !errors.As(err, &pe) {
				t.Fatalf("%s truncated to %d of %d bytes: error %v is not a *postcard.Error", nameOf(m), n, len(enc), err)
			}
			if !errors.Is(err, postcard.ErrUnexpectedEnd) {
				t.Fatalf("%s truncated to %d of %d bytes: %v, want unexpected end", nameOf(m), n, len(enc), err)
			}
		}
		// And one byte too many is trailing garbage.
		if _, err := decodeAs(t, m, append(enc, 0)); !errors.Is(err, postcard.ErrTrailingBytes) {
			t.Errorf("%s with a trailing byte: %v", nameOf(m), err)
		}
	}
}

// Free-text message fields are cut to their bound at a UTF-8 boundary.
func TestMessageTextTruncatedOnEncode(t *testing.T) {
	long := strings.Repeat("é", MaxMessage) // 2 bytes per rune, twice the bound
	m := &LeaseRejectedV1{Lease: sLease, Attempt: sAttempt, Reason: RejectOther, Message: long}
	got, err := decodeAs(t, m, m.AppendPostcard(nil))
	if err != nil {
		t.Fatal(err)
	}
	msg := got.(*LeaseRejectedV1).Message
	if len(msg) != MaxMessage || msg != long[:MaxMessage] {
		t.Errorf("message truncated to %d bytes, want %d", len(msg), MaxMessage)
	}
	odd := "x" + long // the bound now falls inside a rune
	m.Message = odd
	got, err = decodeAs(t, m, m.AppendPostcard(nil))
	if err != nil {
		t.Fatal(err)
	}
	if msg := got.(*LeaseRejectedV1).Message; len(msg) != MaxMessage-1 || msg != odd[:MaxMessage-1] {
		t.Errorf("message truncated to %d bytes, want %d at a rune boundary", len(msg), MaxMessage-1)
	}
	if err := m.Validate(); err != nil {
		t.Errorf("an over-long free-text message is truncated, not invalid: %v", err)
	}
}

// vectorHeartbeat mirrors the JSON value of the shared heartbeat vectors.
type vectorHeartbeat struct {
	Runner         [16]byte `json:"runner"`
	Session        [16]byte `json:"session"`
	Seq            uint64   `json:"seq,string"`
	ActiveAttempts []struct {
		Attempt [16]byte `json:"attempt"`
		Lease   [16]byte `json:"lease"`
		Phase   struct {
			Variant string `json:"variant"`
		} `json:"phase"`
		LogSeq uint64 `json:"log_seq,string"`
	} `json:"active_attempts"`
	CapabilityDigest [32]byte `json:"capability_digest"`
	Resources        struct {
		CPUMillis   uint32 `json:"cpu_millis"`
		MemBytes    uint64 `json:"mem_bytes,string"`
		DiskBytes   uint64 `json:"disk_bytes,string"`
		RunningJobs uint16 `json:"running_jobs"`
	} `json:"resources"`
}

// HeartbeatV1 must encode the shared, Rust-produced vectors byte for byte.
func TestHeartbeatSharedVectors(t *testing.T) {
	const path = "../../../shared/postcard-vectors/vectors.json"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("shared Postcard vectors missing (%v): this test needs %s, the Rust-produced vectors in /work/shared", err, path)
	}
	var all []struct {
		Name  string          `json:"name"`
		Kind  string          `json:"kind"`
		Value json.RawMessage `json:"value"`
		Hex   string          `json:"hex"`
	}
	if err := json.Unmarshal(raw, &all); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	phases := map[string]AttemptPhase{"Preparing": PhasePreparing, "Running": PhaseRunning, "UploadingOutputs": PhaseUploadingOutputs}
	found := map[string]bool{}
	for _, v := range all {
		if !strings.HasPrefix(v.Name, "heartbeat/") || v.Kind != "roundtrip" {
			continue
		}
		found[v.Name] = true
		var jv vectorHeartbeat
		if err := json.Unmarshal(v.Value, &jv); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		m := &HeartbeatV1{
			Runner:           wire.RunnerId{ULID: jv.Runner},
			Session:          wire.AgentSessionId{ULID: jv.Session},
			Seq:              jv.Seq,
			CapabilityDigest: wire.CapabilityDigest{Digest: jv.CapabilityDigest},
			Resources: ResourceSummaryV1{CPUMillis: jv.Resources.CPUMillis, MemBytes: jv.Resources.MemBytes,
				DiskBytes: jv.Resources.DiskBytes, RunningJobs: jv.Resources.RunningJobs},
		}
		for _, a := range jv.ActiveAttempts {
			p, ok := phases[a.Phase.Variant]
			if !ok {
				t.Fatalf("%s: unknown phase %q", v.Name, a.Phase.Variant)
			}
			m.ActiveAttempts = append(m.ActiveAttempts, ActiveAttemptV1{
				Attempt: wire.JobAttemptId{ULID: a.Attempt}, Lease: wire.LeaseId{ULID: a.Lease}, Phase: p, LogSeq: a.LogSeq})
		}
		want, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if got := m.AppendPostcard(nil); !bytes.Equal(got, want) {
			t.Errorf("%s: encoding differs from the Rust vector:\n got %x\nwant %x", v.Name, got, want)
		}
		got, err := decodeAs(t, m, want)
		if err != nil {
			t.Errorf("%s: decode: %v", v.Name, err)
		} else if !reflect.DeepEqual(got, m) {
			t.Errorf("%s: decoded value differs:\n got %+v\nwant %+v", v.Name, got, m)
		}
	}
	if !found["heartbeat/bench_value"] {
		t.Fatalf("%s has no heartbeat/bench_value vector", path)
	}
}

func TestEnumStrings(t *testing.T) {
	cases := []struct {
		got, want string
	}{
		{RoleAgent.String(), "Agent"}, {RoleDeviceAgent.String(), "DeviceAgent"},
		{RoleSigningWorker.String(), "SigningWorker"}, {RoleInternalWorker.String(), "InternalWorker"},
		{PeerRole(4).String(), "PeerRole(4)"},
		{RejectAtCapacity.String(), "AtCapacity"}, {RejectUnsupportedSpec.String(), "UnsupportedSpec"},
		{RejectSpecUnavailable.String(), "SpecUnavailable"}, {RejectDraining.String(), "Draining"},
		{RejectDuplicateAttempt.String(), "DuplicateAttempt"}, {RejectExpired.String(), "Expired"},
		{RejectOther.String(), "Other"}, {LeaseRejectReason(7).String(), "LeaseRejectReason(7)"},
		{CancelUserRequested.String(), "UserRequested"}, {CancelSuperseded.String(), "Superseded"},
		{CancelTimeout.String(), "Timeout"}, {CancelLeaseRevoked.String(), "LeaseRevoked"},
		{CancelRunnerDraining.String(), "RunnerDraining"}, {CancelPolicyViolation.String(), "PolicyViolation"},
		{CancelOther.String(), "Other"}, {CancellationReason(9).String(), "CancellationReason(9)"},
		{AckAccepted.String(), "Accepted"}, {AckDuplicateAccepted.String(), "DuplicateAccepted"},
		{AckStaleRejected.String(), "StaleRejected"}, {AckInvalidRejected.String(), "InvalidRejected"},
		{CompletionAckKind(4).String(), "CompletionAckKind(4)"},
		{RenewExtended.String(), "Extended"}, {RenewRevoked.String(), "Revoked"}, {RenewUnknown.String(), "Unknown"},
		{RenewOutcomeKind(3).String(), "RenewOutcomeKind(3)"},
		{ResultSucceeded.String(), "Succeeded"}, {ResultFailed.String(), "Failed"},
		{ResultCancelled.String(), "Cancelled"}, {ResultTimedOut.String(), "TimedOut"},
		{ResultInfraError.String(), "InfraError"}, {ExecutionResultKind(5).String(), "ExecutionResultKind(5)"},
		{DecisionContinue.String(), "Continue"}, {DecisionCancel.String(), "Cancel"}, {DecisionStale.String(), "Stale"},
		{ResyncDecisionKind(3).String(), "ResyncDecisionKind(3)"},
		{PhasePreparing.String(), "Preparing"}, {PhaseRunning.String(), "Running"},
		{PhaseUploadingOutputs.String(), "UploadingOutputs"}, {AttemptPhase(3).String(), "AttemptPhase(3)"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("String() = %q, want %q", c.got, c.want)
		}
	}
	// The discriminants are frozen wire values.
	frozen := []struct {
		got, want uint32
	}{
		{uint32(RoleInternalWorker), 3}, {uint32(RejectOther), 6}, {uint32(CancelOther), 6},
		{uint32(AckInvalidRejected), 3}, {uint32(RenewUnknown), 2}, {uint32(ResultInfraError), 4},
		{uint32(DecisionStale), 2}, {uint32(PhaseUploadingOutputs), 2},
	}
	for _, f := range frozen {
		if f.got != f.want {
			t.Errorf("discriminant %d, want %d", f.got, f.want)
		}
	}
}
