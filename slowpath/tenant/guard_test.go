package tenant

import "testing"

func TestOverShare(t *testing.T) {
	for _, tc := range []struct {
		demand, slots, active int
		want                  bool
	}{
		{30, 8, 1, false}, // alone: never held back
		{4, 8, 2, false},  // within its equal share of 4
		{5, 8, 2, true},
		{3, 8, 3, true}, // 8/3 = 2
		{2, 1, 2, true}, // a share is at least one slot
		{1, 1, 2, false},
		{5, 0, 2, false}, // no capped slots: the guard does not apply
	} {
		if got := OverShare(tc.demand, tc.slots, tc.active); got != tc.want {
			t.Errorf("OverShare(%d, %d, %d) = %v, want %v", tc.demand, tc.slots, tc.active, got, tc.want)
		}
	}
}

func TestLighter(t *testing.T) {
	for _, tc := range []struct {
		r, d, tr, td int
		want         bool
	}{
		{1, 1, 6, 30, true},  // the quiet tenant against the flood
		{5, 8, 3, 30, false}, // a quiet tenant that fell behind holds more: not lighter
		{3, 5, 3, 30, true},  // as many running, less demand
		{3, 30, 3, 30, false},
	} {
		if got := Lighter(tc.r, tc.d, tc.tr, tc.td); got != tc.want {
			t.Errorf("Lighter(%d, %d, %d, %d) = %v, want %v", tc.r, tc.d, tc.tr, tc.td, got, tc.want)
		}
	}
}

func TestNeed(t *testing.T) {
	for _, tc := range []struct{ headroom, others, least, want int }{
		{1, 0, 1, 1}, {2, 0, 1, 2}, {2, 1, 1, 1}, {2, 5, 1, 1}, {3, 1, 1, 2},
		{2, 0, 0, 2}, {2, 5, 0, 1}, // at least one
		{2, 1, 2, 2}, {2, 5, 2, 2}, {3, 1, 2, 2}, {3, 2, 2, 2}, {3, 0, 2, 3}, // headroom_min
	} {
		if got := Need(tc.headroom, tc.others, tc.least); got != tc.want {
			t.Errorf("Need(%d, %d, %d) = %d, want %d", tc.headroom, tc.others, tc.least, got, tc.want)
		}
	}
}

func TestMayStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads []ReplicaLoad
		i     int
		need  int
		want  bool
	}{
		{"other replica clean with a free slot", []ReplicaLoad{{Free: 1}, {Free: 1}}, 0, 1, true},
		{"no free slot here", []ReplicaLoad{{Free: 0}, {Free: 3}}, 0, 1, false},
		{"the last clean free slot would go", []ReplicaLoad{{Free: 2}, {Free: 0}}, 0, 1, false},
		{"another tenant's first token pending here", []ReplicaLoad{{Free: 2, Others: true}, {Free: 2}}, 0, 1, false},
		{"a heavy prefill already runs here", []ReplicaLoad{{Free: 2, Heavy: true}, {Free: 2}}, 0, 1, false},
		{"the other replica's free slots carry a heavy prefill", []ReplicaLoad{{Free: 1}, {Free: 3, Heavy: true}}, 0, 1, false},
		{"need 2: one clean free slot elsewhere is not enough", []ReplicaLoad{{Free: 1}, {Free: 1}, {Free: 0}}, 0, 2, false},
		{"need 2: two clean replicas with one each", []ReplicaLoad{{Free: 1}, {Free: 1}, {Free: 1}}, 0, 2, true},
		{"one replica keeps need free slots", []ReplicaLoad{{Free: 2}}, 0, 1, true},
		{"one replica, the last free slot", []ReplicaLoad{{Free: 1}}, 0, 1, false},
		{"one replica, another tenant's prefill", []ReplicaLoad{{Free: 3, Others: true}}, 0, 1, false},
	} {
		if got := MayStart(tc.loads, tc.i, tc.need); got != tc.want {
			t.Errorf("%s: MayStart(%+v, %d, %d) = %v, want %v", tc.name, tc.loads, tc.i, tc.need, got, tc.want)
		}
	}
}
