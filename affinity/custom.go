package affinity

// NewRouterWithPolicy returns a Router that ranks with p instead of a
// built-in policy: the bench uses it to run the anchors' published policies
// on exactly the same index and load state as warmpath's own. cfg.Policy is
// ignored. p's optional BeginHook and RemoveHook are honoured.
func NewRouterWithPolicy(cfg Config, p Policy) (*Router, error) {
	cfg.Policy = ""
	r, err := NewRouter(cfg)
	if err != nil {
		return nil, err
	}
	r.policy = p
	r.onBegin, _ = p.(BeginHook)
	r.onRemove, _ = p.(RemoveHook)
	return r, nil
}
