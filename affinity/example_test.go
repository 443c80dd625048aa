package affinity_test

import (
	"fmt"

	"github.com/warmpath/warmpath/affinity"
)

// A request's life: parse, decide, begin, first token, end. The second
// request shares the first one's system prompt and goes to the warm replica.
func Example() {
	r, _ := affinity.NewRouter(affinity.Config{Seed: 1})
	for _, name := range []string{"a:8000", "b:8000", "c:8000"} {
		_, _ = r.AddReplica(affinity.ReplicaSpec{Name: name, Models: []string{"llama"}})
	}
	p := affinity.NewParser(r.HashConfig())
	system := fmt.Sprintf("%0512d", 0) // a 512-byte system prompt: 2 blocks
	var (
		pr  affinity.Prompt
		req affinity.Request
		d   affinity.Decision
		f   affinity.Flight
	)
	now := int64(1)
	for _, q := range []string{"first question", "second question"} {
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q)
		if err := p.ParseChat([]byte(body), &pr); err != nil {
			panic(err)
		}
		pr.Fill(&req, now)
		if err := r.Decide(&req, &d); err != nil {
			panic(err)
		}
		fmt.Printf("%s: %d ranked, predicted cached tokens on the best: %d\n", q, len(d.Ranked), d.CachedTokens[0])
		r.Begin(d.Ranked[0], &req, &d, &f)
		r.FirstToken(&f, now+1e6)
		r.End(&f, now+2e6, -1, true)
		now += 1e9
	}
	// Output:
	// first question: 3 ranked, predicted cached tokens on the best: 0
	// second question: 3 ranked, predicted cached tokens on the best: 128
}
