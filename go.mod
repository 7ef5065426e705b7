module forgeyard.dev/transport

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/dunglas/httpsfv v1.1.1 // indirect
	github.com/hashicorp/yamux v0.1.2 // indirect
	github.com/oklog/ulid/v2 v2.1.1 // indirect
	github.com/quic-go/qpack v0.6.0 // indirect
	github.com/quic-go/quic-go v0.64.1 // indirect
	github.com/quic-go/webtransport-go v0.13.0 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
