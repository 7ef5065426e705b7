package daemon

import (
	"errors"

	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/postcard"
)

// completionFixed is the size of AttemptCompletionV1's fixed prefix: job,
// attempt and lease ids (16 bytes each) and the spec digest (32 bytes).
const completionFixed = 3*16 + 32

// EncodeResult returns the wire encoding of an ExecutionResultV1 — the
// bytes stored as authority.Completion.Result. wire/agent exposes the
// result only inside AttemptCompletionV1, so the encoding is cut out of a
// completion with no outputs, whose tail is the two one-byte zeros
// len(outputs) and log_last_seq.
func EncodeResult(r agentwire.ExecutionResultV1) []byte {
	m := agentwire.AttemptCompletionV1{Result: r}
	b := m.AppendPostcard(nil)
	return append([]byte(nil), b[completionFixed:len(b)-2]...)
}

// DecodeResult decodes bytes produced by EncodeResult.
func DecodeResult(b []byte) (agentwire.ExecutionResultV1, error) {
	if len(b) == 0 || len(b) > 512 {
		return agentwire.ExecutionResultV1{}, errors.New("daemon: encoded result empty or too long")
	}
	buf := make([]byte, completionFixed, completionFixed+len(b)+2)
	buf = append(append(buf, b...), 0, 0)
	var m agentwire.AttemptCompletionV1
	d := postcard.NewDecoder(buf)
	m.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		return agentwire.ExecutionResultV1{}, err
	}
	return m.Result, nil
}
