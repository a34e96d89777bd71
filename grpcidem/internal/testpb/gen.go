// Package testpb is the gRPC service of grpcidem's tests and examples.
//
// Regenerate the code after editing pay.proto (protoc 3.21 or later,
// protoc-gen-go v1.36.12, protoc-gen-go-grpc v1.6.2):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go generate ./internal/testpb
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative pay.proto
