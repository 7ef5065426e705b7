package semantics_test

import (
	"context"
	"fmt"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// A server that serves every stream the peer opens on a goroutine of its
// own hands them to HandleStreams: the stream is served on the goroutine
// that read its header, and no goroutine waits for the next one while the
// connection is idle.
func ExampleConn_HandleStreams() {
	cb, sb := memory.Pipe(memory.Options{})
	client, _ := semantics.NewConn(cb, semantics.Config{})
	server, _ := semantics.NewConn(sb, semantics.Config{})
	defer client.CloseWithCode(wire.CloseNormal, "")
	defer server.CloseWithCode(wire.CloseNormal, "")

	served := make(chan string)
	server.HandleStreams(func(st *semantics.Stream) {
		frame, err := st.ReadFrame()
		if err != nil {
			served <- "error: " + err.Error()
			return
		}
		served <- fmt.Sprintf("%s stream: %q", st.Kind(), frame)
	})

	st, err := client.OpenStream(context.Background(), wire.StreamDiagnostic)
	if err != nil {
		panic(err)
	}
	_ = st.WriteFrame(func(b []byte) []byte { return append(b, "hello"...) })
	fmt.Println(<-served)
	_, err = server.AcceptStream(context.Background())
	fmt.Println(err == semantics.ErrStreamsHandled)
	// Output:
	// diagnostic stream: "hello"
	// true
}
