module github.com/txlimit/txlimit/grpclimit

go 1.26.0

require github.com/txlimit/txlimit v0.0.0

require (
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260120221211-b8f7ae30c516 // indirect
	google.golang.org/grpc v1.80.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)

replace github.com/txlimit/txlimit => ../
