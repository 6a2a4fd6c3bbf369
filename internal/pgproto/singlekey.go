package pgproto

// KeyShards is some rows of one key.
type KeyShards struct {
	Name, Key string
	Shards    []int32
}

// ByKey groups rows by key, the keys in the order of their first row: the
// rows of a store's SingleKeyStatements option, which deletes the rows of
// one key per statement.
func ByKey(rows []RowRef) []KeyShards {
	var out []KeyShards
	index := map[[2]string]int{}
	for _, r := range rows {
		k := [2]string{r.Name, r.Key}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, KeyShards{Name: r.Name, Key: r.Key})
		}
		out[i].Shards = append(out[i].Shards, r.Shard)
	}
	return out
}
