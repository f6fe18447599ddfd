"""Many brokerd nodes as one broker: the engines that share routing between nodes (docs/cluster.md)."""
