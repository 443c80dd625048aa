package fastpath

// CounterKind indexes Counters.Global. The order mirrors enum counter_idx in
// bpf/warmpath.c; TestCounterLayout checks the sizes agree.
type CounterKind int

const (
	PassNotIPv4      CounterKind = iota // not IPv4 (IPv6, ARP, VLAN): passed
	PassNotService                      // IPv4 but not TCP to a service: passed
	PassFragment                        // IPv4 TCP fragment: passed
	PassLocal                           // service packet of a LOCAL flow: passed
	PassNoState                         // service non-SYN, no flow, no affinity: passed
	Steered                             // encapsulated and redirected/transmitted
	SteeredStack                        // encapsulated and passed (neighbour unresolved)
	Dropped                             // steered flow that cannot be forwarded now
	ErrMalformed                        // truncated or invalid header: passed
	ErrFIB                              // route lookup failed
	ErrFragNeeded                       // encapsulated packet exceeds the egress MTU
	ErrHeadroom                         // bpf_xdp_adjust_head failed
	FlowNewSteer                        // SYN decided: backend
	FlowNewLocal                        // SYN decided: LOCAL
	FlowRestored                        // non-SYN without flow entry steered from affinity
	AffinityStale                       // affinity ignored: unhealthy, old generation, unknown
	Sampled                             // affinity SYN sampled to the slowpath
	DecapOK                             // decap: outer header stripped
	DecapPass                           // decap: not IPIP for a service, passed untouched
	DecapMalformed                      // decap: truncated or invalid inner packet
	DecapErrHeadroom                    // decap: bpf_xdp_adjust_head failed
	ICMPFragNeeded                      // ICMP "fragmentation needed" sent to a client (XDP_TX)
	NumCounterKinds
)

// backendSlots is BE_SLOTS in bpf/warmpath.c.
const backendSlots = 3

var counterNames = [NumCounterKinds]string{
	"pass_not_ipv4", "pass_not_service", "pass_fragment", "pass_local", "pass_no_state",
	"steered", "steered_stack", "dropped",
	"err_malformed", "err_fib", "err_frag_needed", "err_headroom",
	"flow_new_steer", "flow_new_local", "flow_restored", "affinity_stale", "sampled",
	"decap_ok", "decap_pass", "decap_malformed", "decap_err_headroom",
	"icmp_frag_needed",
}

// String returns the snake_case name used in metrics and status.
func (k CounterKind) String() string {
	if k < 0 || k >= NumCounterKinds {
		return "unknown"
	}
	return counterNames[k]
}

// Backend returns the counters of id, zero if none.
func (c *Counters) Backend(id BackendID) BackendCounters {
	for _, b := range c.Backends {
		if b.ID == id {
			return b
		}
	}
	return BackendCounters{ID: id}
}
