# The suite's one sealed sequence on the census, run once and shared by the test files:
# five analyses that are released, one that is withheld, one never revealed.
.shared <- new.env()

common_run <- function() {
  if (is.null(.shared$results)) {
    plan <- sa_plan(session, "census") |>
      sa_frequency_table("region", "sex") |>
      sa_ols(income ~ age + sex, where = "employment == 'employed'") |>
      sa_histogram("age", bins = 4) |>
      sa_summary(income ~ sex) |>
      sa_t_test(income ~ sex) |>
      sa_frequency_table(~ ethnicity + region) |>
      sa_frequency_table(~ health + ethnicity)
    .shared$plan <- plan
    .shared$rehearsal <- sa_rehearse(plan, show = FALSE)
    .shared$sealed <- sa_seal(session, plan)
    .shared$sealed_file <- tempfile(fileext = ".json")
    sa_write_sealed(.shared$sealed, .shared$sealed_file)
    .shared$seen <- integer()
    .shared$results <- sa_run(session, .shared$sealed, on_step = function(step) {
      .shared$seen <- c(.shared$seen, step$index)
    })
  }
  .shared
}

# A released step's frame as Python's frame() gives it, with its named index levels as leading
# columns (reset_index): names and values, in Python.
python_frame <- function(step) {
  convert <- reticulate::py_run_string(paste(
    "def plain(result):",
    "    frame = result.frame()",
    "    named = all(n is not None for n in frame.index.names)",
    "    frame = frame.reset_index(drop=not named)",
    "    def cell(v):",
    "        if v is None or v != v:",
    "            return None",
    "        return v.item() if hasattr(v, 'item') else v",
    "    return {'names': [str(c) for c in frame.columns],",
    "            'values': [[cell(v) for v in frame[c].astype(object)] for c in frame.columns]}",
    sep = "\n"
  ))$plain
  convert(step$py)
}

# The suite's second sequence: a Kaplan-Meier curve by arm on the survival cohort.
cohort_run <- function() {
  if (is.null(.shared$cohort)) {
    plan <- sa_plan(session, "cohort") |>
      sa_survival(Surv(days, died) ~ arm, interval = 90, max_time = 720)
    .shared$cohort_sealed <- sa_seal(session, plan)
    .shared$cohort <- sa_run(session, .shared$cohort_sealed)
  }
  .shared$cohort
}

# The cohort's records (the reference for the released curve), from the setup file's generator.
cohort_records <- function() {
  module <- reticulate::import_from_path("cohort_setup", ".", convert = FALSE)
  plain <- reticulate::py_eval(
    "lambda f: {'arm': f['arm'].astype(str).tolist(), 'days': f['days'].tolist(), 'died': f['died'].tolist()}"
  )
  as.data.frame(lapply(plain(module$cohort()), unlist), stringsAsFactors = FALSE)
}

cohort_sealed <- function() {
  cohort_run()
  .shared$cohort_sealed
}
