package affinity

import (
	"slices"
	"testing"
)

func TestReplicaNames(t *testing.T) {
	r, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ReplicaID
	for _, n := range []string{"a:1", "b:2", "c:3"} {
		id, err := r.AddReplica(ReplicaSpec{Name: n, Models: []string{"m"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	r.RemoveReplica(ids[1])
	got := r.ReplicaNames(nil)
	want := make([]string, len(got))
	want[ids[0]], want[ids[2]] = "a:1", "c:3"
	if !slices.Equal(got, want) {
		t.Fatalf("ReplicaNames = %q, want %q", got, want)
	}
	buf := make([]string, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf = r.ReplicaNames(buf) }); n != 0 {
		t.Fatalf("ReplicaNames allocates %v per call with a large enough dst", n)
	}
}
