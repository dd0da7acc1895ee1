# docs/r.md's common path in R runs as written against the centre (its address and key
# replaced by the test centre's), in at most 12 lines.

test_that("the common path of docs/r.md runs, saves its results folder and ends in a frame", {
  expect_lte(length(docs_block()), 12)
  run <- common_run()
  expect_equal(run$value$term, c("Intercept", "C(sex)[T.M]", "age"))
  expect_true(any(grepl("^step 5 of 5 \\(test\\): RELEASED", run$printed)))     # progress = TRUE
  expect_true(any(grepl("predicts nothing about the real verdicts", run$printed, fixed = TRUE)))
  summary <- file.path(run$folder, "summary.json")
  expect_match(paste(readLines(summary), collapse = ""),
               '"outcome": "finished: all 5 steps released"', fixed = TRUE)
})
