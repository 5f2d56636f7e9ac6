module dtq/clients/go

go 1.19

require (
	github.com/golang/protobuf v1.3.5
	golang.org/x/net v0.7.0 // indirect
	golang.org/x/sys v0.3.0
	golang.org/x/text v0.7.0 // indirect
	google.golang.org/genproto v0.0.0-20200413115906-b5235f65be36 // indirect
	google.golang.org/grpc v1.33.3
)
