package workload

// Reuse measures, for an unbounded cache, how many prompt tokens of w could be
// served from earlier requests' prefixes: a request reuses its longest run of
// leading segments that some earlier request (of the same model) also began
// with. Segments are the unit, so this is exact for traces whose segments are
// cache blocks (Mooncake) and a close bound for the generated shapes.
func Reuse(w *Workload) (reusable, total int64) {
	seen := make(map[uint64]struct{}, len(w.Requests)*4)
	for i := range w.Requests {
		r := &w.Requests[i]
		h := segID("model", 0, 0, 0)
		for j := 0; j < len(r.Model); j++ {
			h = mix(h ^ uint64(r.Model[j]))
		}
		hit := true
		for mi := range r.Messages {
			m := &r.Messages[mi]
			h = mix(h ^ uint64(m.Role+1)<<56)
			for _, s := range m.Segments {
				h = mix(h ^ s.ID ^ uint64(s.Tokens)<<40)
				total += int64(s.Tokens)
				if _, ok := seen[h]; ok && hit {
					reusable += int64(s.Tokens)
					continue
				}
				hit = false
				seen[h] = struct{}{}
			}
		}
	}
	return reusable, total
}
