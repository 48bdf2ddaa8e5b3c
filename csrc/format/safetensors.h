/* safetensors.h — reader for Hugging Face model directories: safetensors files (one, or shards
 * listed in model.safetensors.index.json) and the JSON files beside them.
 *
 * A safetensors file is: u64 little-endian header length N | N bytes of JSON
 *   {"__metadata__": {...}, "<name>": {"dtype": "F16", "shape": [rows, cols],
 *    "data_offsets": [begin, end]}, ...} | data; offsets count from the first byte after the
 * header. Every tensor's extent is checked against its dtype, shape and the file size. */
#ifndef SD_SAFETENSORS_H
#define SD_SAFETENSORS_H

#include "util/json.h"
#include "util/mapfile.h"
#include "specdec.h"
#include "format/tensor.h"

typedef struct {
    int n_files;
    sd_mapping *maps; /* (n_files) */
    int n_tensors;
    sd_tensor_info *tensors; /* (n_tensors), views into maps */
} sd_st_set;

/* Open the weights of the model directory `dir`: model.safetensors, or every shard named by
 * model.safetensors.index.json. */
sd_status sd_st_open_dir(sd_st_set **out, const char *dir);
/* Open the one safetensors file `path`. */
sd_status sd_st_open_file(sd_st_set **out, const char *path);
void sd_st_close(sd_st_set *set);
const sd_tensor_info *sd_st_find(const sd_st_set *set, const char *name);

/* Read and parse the JSON file `path`. A missing file is SD_ERR_IO. */
sd_status sd_json_read_file(sd_json **out, const char *path);

#endif /* SD_SAFETENSORS_H */
