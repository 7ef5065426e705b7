package daemon

import (
	"fmt"

	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/postcard"
)

// EncodeResult encodes an execution result the way the authority stores it
// (authority.Completion.Result): the wire ExecutionResultV1 enum.
func EncodeResult(r agentwire.ExecutionResultV1) []byte {
	return r.AppendPostcard(nil)
}

// DecodeResult decodes bytes produced by EncodeResult.
func DecodeResult(b []byte) (agentwire.ExecutionResultV1, error) {
	var r agentwire.ExecutionResultV1
	d := postcard.NewDecoder(b)
	r.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		return agentwire.ExecutionResultV1{}, fmt.Errorf("daemon: stored result: %w", err)
	}
	return r, nil
}
