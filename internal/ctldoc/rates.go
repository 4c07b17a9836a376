package ctldoc

// TopicRates is the QUERY topic of the pacing rate tables (bypassctl rates).
const TopicRates = "rates"

// RatesDoc answers TopicRates: one rate table per interface.
type RatesDoc struct {
	Tables []RateTableDoc `json:"tables"`
}

// RateTableDoc is one interface's rate table: its limits, occupancy,
// counters and entries.
type RateTableDoc struct {
	Interface string `json:"interface"`
	// Capacity is the number of distinct rates; Used how many are taken.
	Capacity int `json:"capacity"`
	Used     int `json:"used"`
	// MinKbps and MaxKbps bound the rates (kbit/s of wire bytes).
	MinKbps uint32 `json:"min_kbps"`
	MaxKbps uint32 `json:"max_kbps"`
	// Queues is the number of paced sockets, MaxQueues the most allowed.
	Queues    int `json:"queues"`
	MaxQueues int `json:"max_queues"`
	// Policy is what a full table does: "refuse" or "nearest".
	Policy string `json:"policy"`
	// Cumulative counters: rates granted, granted by sharing an entry,
	// granted a nearest rate instead, refused for a full table or queue
	// limit, refused for the range.
	Acquired     uint64         `json:"acquired"`
	Shared       uint64         `json:"shared"`
	Nearest      uint64         `json:"nearest"`
	RefusedFull  uint64         `json:"refused_full"`
	RefusedRange uint64         `json:"refused_range"`
	Entries      []RateEntryDoc `json:"entries"`
}

// RateEntryDoc is one rate in use.
type RateEntryDoc struct {
	Index int    `json:"index"`
	Kbps  uint32 `json:"kbps"`
	// MaxBurst and TypicalBytes are as the sockets set them (0: default);
	// Burst is the burst in effect, in bytes.
	MaxBurst     uint32 `json:"max_burst"`
	TypicalBytes uint16 `json:"typical_bytes"`
	Burst        uint32 `json:"burst"`
	// Users is the number of sockets paced at this rate.
	Users int `json:"users"`
}
