package cluster

// Test helpers shared with the external test package (fleet_test.go).
var (
	StartNATS = startNATS
	NATSURL   = natsURL
	NATSPort  = natsPort
)
