// Package pb holds the protobuf baseline messages for the codec benchmarks
// in wire/internal/codecbench. codec.pb.go is generated from codec.proto by
// protoc and protoc-gen-go v1.36.12 and committed so builds never need protoc.
package pb
