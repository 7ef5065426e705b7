// Package qadapt is library-neutral code of the QUIC backends' connection
// adapters (backends/quic over quic-go, backends/webtransport over
// webtransport-go), which may not share code that imports the libraries
// (internal/testkit/deptest).
//
// The stream adapters' Read and Write are not here: called through a type
// parameter, the library's Read and Write would be indirect calls on the
// data path (Go reaches a type argument's methods through a dictionary).
// Opening and accepting a stream is off that path.
package qadapt

import "context"

// Stream opens or accepts a stream with open (a library connection's
// OpenStreamSync, AcceptStream, ...) and returns it adapted by wrap, or,
// when open fails, the zero R and open's error passed through translate
// (the backend's error translation).
func Stream[L, R any](ctx context.Context, open func(context.Context) (L, error), translate func(error) error, wrap func(L) R) (R, error) {
	s, err := open(ctx)
	if err != nil {
		var zero R
		return zero, translate(err)
	}
	return wrap(s), nil
}
