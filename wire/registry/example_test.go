package registry_test

import (
	"fmt"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/registry"
)

// Decoding a frame body with the default registry: the payload's type id
// selects the Go type, and the registry bounds the body before decoding it.
func ExampleDefault() {
	env := wire.Envelope{
		Protocol: wire.Current,
		SentAtMs: 1767225600000,
		Payload:  &wire.WireErrorV1{Code: wire.ErrCodeDraining, Retry: wire.RetryBackoff, Message: "daemon draining"},
	}
	body := env.AppendPostcard(nil)

	got, err := wire.DecodeEnvelope(body, registry.Default)
	if err != nil {
		fmt.Println("decode:", err)
		return
	}
	mi, _ := registry.Default.Lookup(got.Payload.MessageType())
	fmt.Println(mi.Type, mi.Name, "since", mi.Since)
	fmt.Println(got.Payload.(*wire.WireErrorV1).Error())
	// Output:
	// 0x0001 common.WireErrorV1 since 1.0
	// peer error Draining (retry Backoff): daemon draining
}
