// Prints the batches llm.c's own DataLoader (llmc/dataloader.h, shuffling on) serves, then its state:
// the independent reference for llmc_io/llmc_state.py. Usage: harness PATTERN B T NUM_BATCHES
// Output lines: "batch TOK0 TOK1 ... TOK(B*T)" (the B*T+1 tokens read), then
// "state SHARD_IDX SAMPLE_IDX", "shards ...", "intra ...", "mt LEFT NEXT WORD0 ... WORD623".
#include <stdio.h>
#include <stdlib.h>
#include "dataloader.h"

int main(int argc, char** argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s PATTERN B T NUM_BATCHES\n", argv[0]); return 2; }
    size_t B = (size_t)atoi(argv[2]), T = (size_t)atoi(argv[3]);
    int n = atoi(argv[4]);
    DataLoader loader;
    dataloader_init(&loader, argv[1], B, T, 0, 1, 1);
    for (int b = 0; b < n; b++) {
        dataloader_next_batch(&loader);
        printf("batch");
        for (size_t i = 0; i <= B * T; i++) printf(" %u", (unsigned)loader.buffer[i]);
        printf("\n");
    }
    printf("state %zu %zu\nshards", loader.current_shard_idx, loader.current_sample_idx);
    for (size_t i = 0; i < loader.glob_result.gl_pathc; i++) printf(" %d", loader.shard_indices[i]);
    printf("\nintra");
    for (size_t i = 0; i < loader.shard_num_samples; i++) printf(" %d", loader.intra_shard_indices[i]);
    printf("\nmt %d %u", loader.shuffle_rng.left_, loader.shuffle_rng.next_);
    for (int i = 0; i < MERSENNE_STATE_N; i++) printf(" %u", loader.shuffle_rng.state_[i]);
    printf("\n");
    dataloader_free(&loader);
    return 0;
}
