// The Go client of hami-accounting: the generated code of protos/hami/accounting/v1
// (package accountingv1) and the client package hamiaccounting. docs/go-clients.md says how
// to use it in module mode and how this repository builds it in GOPATH mode.
module github.com/hami-accounting/hami-accounting/clients/go

// 1.16: the oldest Go the code builds with (it calls os.ReadFile). It also keeps this list to
// the modules the code imports itself: a go 1.17 or later go.mod must list every module it
// imports indirectly as well, at versions only `go mod tidy` against the module proxy can work
// out, and the machines this repository is built on have no module proxy.
go 1.16

// The versions the code is built and tested with here (Debian 12's packages), so the oldest it
// is known to work with. Minimal version selection gives a program that requires newer ones
// those instead.
require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
