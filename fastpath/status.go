package fastpath

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// statusMaxAffinity bounds the affinity entries WriteStatus lists.
const statusMaxAffinity = 1000

// WriteStatus prints dp's mode, services, backends, affinity entries (at
// most 1000, then a count) and non-zero counters, for `warmpath status`.
func WriteStatus(w io.Writer, dp Datapath) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "fastpath mode: %s\n", dp.Mode())
	svcs, err := dp.Services()
	if err != nil {
		return fmt.Errorf("status services: %w", err)
	}
	fmt.Fprintf(tw, "\nservices (%d):\n", len(svcs))
	for _, s := range svcs {
		fmt.Fprintf(tw, "  %v/tcp\n", s)
	}
	bs, err := dp.Backends()
	if err != nil {
		return fmt.Errorf("status backends: %w", err)
	}
	gens := make(map[BackendID]Backend, len(bs))
	fmt.Fprintf(tw, "\nbackends (%d):\n  ID\tADDR\tHEALTHY\tGEN\tSAMPLE_EVERY\n", len(bs))
	for _, b := range bs {
		gens[b.ID] = b
		fmt.Fprintf(tw, "  %d\t%v\t%t\t%d\t%d\n", b.ID, b.Addr, b.Healthy, b.Generation, b.SampleEvery)
	}
	fmt.Fprintf(tw, "\naffinity:\n  CLIENT\tSERVICE\tBACKEND\tGEN\tIDLE\tVALID\n")
	n := 0
	err = dp.RangeAffinity(func(e AffinityEntry) bool {
		n++
		if n <= statusMaxAffinity {
			b, ok := gens[e.Backend]
			valid := ok && b.Healthy && b.Generation == e.Generation
			fmt.Fprintf(tw, "  %v\t%v\t%d\t%d\t%v\t%t\n", e.Client, e.Service, e.Backend, e.Generation, e.Idle.Truncate(time.Millisecond), valid)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("status affinity: %w", err)
	}
	if n > statusMaxAffinity {
		fmt.Fprintf(tw, "  ... %d more\n", n-statusMaxAffinity)
	}
	fmt.Fprintf(tw, "  (%d entries)\n", n)
	cs, err := dp.Counters()
	if err != nil {
		return fmt.Errorf("status counters: %w", err)
	}
	fmt.Fprintf(tw, "\ncounters (non-zero):\n  KIND\tPACKETS\tBYTES\n")
	for k := range NumCounterKinds {
		if c := cs.Global[k]; c.Packets != 0 {
			fmt.Fprintf(tw, "  %v\t%d\t%d\n", k, c.Packets, c.Bytes)
		}
	}
	if len(cs.Backends) > 0 {
		fmt.Fprintf(tw, "\nbackend counters:\n  ID\tSTEERED_PKTS\tSTEERED_BYTES\tSYN\tSAMPLED\n")
		for _, b := range cs.Backends {
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\n", b.ID, b.Steered.Packets, b.Steered.Bytes, b.SYN.Packets, b.Sampled.Packets)
		}
	}
	return tw.Flush()
}
