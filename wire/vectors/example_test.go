package vectors_test

import (
	"fmt"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/vectors"
)

// Generating the vectors of a protocol version and checking one against the
// current decoder, as the tests do for every committed file.
func ExampleCheck() {
	files, err := vectors.Generate(wire.V(1, 0))
	if err != nil {
		fmt.Println(err)
		return
	}
	v := files["common"][0]
	env, err := vectors.Check(v, registry.Default)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(v.Name, v.Type, "protocol", env.Protocol)
	fmt.Println("body", v.BodyHex[:6], "message id", env.MessageID)
	// Output:
	// common.WireErrorV1#0 0x0001 protocol 1.0
	// body 0a0323 message id 01KDVDNA00DNJQ6WV1CXJJTTB4
}
