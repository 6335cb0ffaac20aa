// The build pipeline (internal), after oneTBB's parallel_pipeline example:
//   ReadStage   (serial, in order): hands out chunks of source positions
//   DecodeStage (parallel):         preprocesses each source into the chunk's
//                                   payload buffer, or records why not
//   WriteStage  (serial, in order): appends records, logs rejects
// Tokens carry chunks of kChunk items; chunks come from a pool, so memory is
// bounded by tokens x chunk x record size whatever the dataset.
#ifndef KILN_SRC_INGEST_PIPELINE_H_
#define KILN_SRC_INGEST_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "journal.h"
#include "kiln/cache_writer.h"
#include "kiln/ingest/build.h"
#include "preprocessor.h"

namespace kiln::ingest {

struct PipelineJob {
  const SourceList* sources = nullptr;
  const std::vector<size_t>* order = nullptr;  // source items in record order
  size_t start = 0;                            // first position of `order` to process
  const Preprocessor* preprocessor = nullptr;
  int threads = 0;      // 0 = all cores
  bool strict = false;  // the first reject fails the run
  // Format 2 records (RecordFieldSpecs): the image (whole, or the
  // preprocessor's fixed shape), then "label" or "labels", then "target".
  bool fields = false;
};

// The fields of a format 2 cache kiln build writes for `src` and `pre`:
// "image" (C x ? x ? for whole images, else the fixed shape), "label"
// (int64 scalar) or, for a CSV with several labels, "labels" (int64, ?),
// and "target" (float32, the CSV's float columns) when it has any. Sets
// *label_field ("label", or "" for several labels).
std::vector<FieldSpec> BuildFieldSpecs(const SourceList& src, const Preprocessor& pre,
                                       std::string* label_field);
// The most fields BuildFieldSpecs declares.
inline constexpr int kMaxBuildFields = 4;
// The format 2 record of source `it`, in BuildFieldSpecs's order, into
// out[0..n): `image` (its payload and shape), `mask` when the build has
// masks (ignored otherwise), the label or labels, the targets. Returns n.
// The data point into `it`, `image` and `mask`, which must outlive them.
int BuildRecordFields(const SourceList& src, const Preprocessor& pre, const SourceItem& it,
                      const FieldData& image, const FieldData& mask, FieldData* out);
// One source made into its format 2 record again, outside the pipeline
// (--repair, verify --level deep): the buffers the fields point into.
struct RemadeRecord {
  std::vector<uint8_t> image, mask;
  Shape image_shape, mask_shape;
  FieldData fields[kMaxBuildFields];
  int num_fields = 0;
};
// Processes `item` of `src` as the pipeline does - the image (whole or
// fixed), its mask when the build has masks - and sets out->fields by
// BuildRecordFields. Returns why the source cannot be made into a record,
// as the preprocessor says it. `out` must not move while its fields are
// used.
Status RemakeRecord(const SourceList& src, const Preprocessor& pre, const SourceItem& item,
                    Preprocessor::Scratch* scratch, RemadeRecord* out);
// Whether kiln build writes format 2 for these sources and recipe: whole
// images, or a CSV of several labels or float targets.
bool BuildWritesFields(const SourceList& src, const Preprocessing& recipe);

struct PipelineCounts {
  uint64_t written = 0;   // records appended by this run
  uint64_t bytes = 0;     // their payload bytes
  uint64_t rejected = 0;  // sources rejected by this run
};

// Processes positions start.. of the job's order: each good record is
// appended to `writer` (at its next index), each bad source logged in
// `rejects` (positions it already holds are skipped). `tick` is called from
// the writer stage at most every 500 ms. Returns the first write or log
// failure, or under strict the first reject (Corruption naming the file);
// the pipeline then stops reading and decoding.
Status RunPipeline(const PipelineJob& job, CacheWriter* writer, RejectLog* rejects,
                   const std::function<void(const PipelineCounts&)>& tick, PipelineCounts* counts);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_PIPELINE_H_
