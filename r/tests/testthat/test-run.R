# The common path from R against the centre: rehearse, seal, run; released outputs are
# data.frames with frame()'s columns, and their numbers are R's own (table, lm, hist, t.test).

test_that("a sequence runs tit-for-tat and stops at the withhold, never revealing the rest", {
  run <- withheld_run()
  expect_equal(vapply(run$results, `[[`, "", "status"), c("released", "withheld"))
  expect_equal(run$seen, 1:2)                       # on_step saw each step, in order
  last <- run$results[[2]]
  expect_equal(last$reasons$check, "disclosure_control")
  expect_null(last$output)
  expect_null(as.data.frame(last))
  expect_equal(last$sequence_state, "aborted")
  expect_equal(run$sealed$steps, 3L)                # step 3 was never revealed
  expect_equal(run$rehearsal$steps$index, 1:3)
  expect_true(all(run$rehearsal$steps$mock_verdict %in% c("release", "withhold", "review")))
  expect_match(run$rehearsal$text, "predicts nothing about the real verdicts", fixed = TRUE)
  expect_output(print(run$results), "step 2 \\(frequency_table\\): WITHHELD on census@1")
})

test_that("every released frame has the columns and values of frame() in Python", {
  run <- common_run()
  for (step in run$results) {
    mine <- as.data.frame(step)
    theirs <- python_frame(step)
    expect_equal(names(mine), theirs$names, info = step$kind)
    for (i in seq_along(mine)) {
      expected <- vapply(theirs$values[[i]], function(v) if (is.null(v)) NA else v,
                         mine[[i]][1])
      expect_equal(unname(mine[[i]]), unname(expected), info = paste(step$kind, names(mine)[i]))
    }
  }
})

test_that("the frequency table's counts are R's table() of the records, as integers", {
  frame <- as.data.frame(common_run()$results[[1]])
  expect_equal(names(frame), c("region", "F", "M"))
  expect_type(frame$F, "integer")
  reference <- table(census$region, census$sex)
  expect_equal(frame$F, as.vector(reference[frame$region, "F"]))
  expect_equal(frame$M, as.vector(reference[frame$region, "M"]))
})

test_that("the regression is R's lm() on the records", {
  frame <- as.data.frame(common_run()$results[[3]])
  fit <- summary(lm(income ~ age + factor(sex), data = census))$coefficients
  terms <- c(Intercept = "(Intercept)", age = "age", "C(sex)[T.M]" = "factor(sex)M")
  expect_setequal(frame$term, names(terms))
  expect_equal(frame$estimate, unname(fit[terms[frame$term], "Estimate"]), tolerance = 1e-9)
  expect_equal(frame$std_error, unname(fit[terms[frame$term], "Std. Error"]), tolerance = 1e-9)
  expect_equal(attr(frame, "attrs")$n, nrow(census))
})

test_that("the histogram's bins between the declared bounds are hist()'s counts", {
  frame <- as.data.frame(common_run()$results[[4]])
  edges <- seq(16, 95, length.out = 5)
  reference <- hist(census$age, breaks = edges, right = FALSE, include.lowest = TRUE,
                    plot = FALSE)$counts
  expect_equal(unname(unlist(frame[1, ])), reference)
})

test_that("the summary and Welch's t test are R's", {
  run <- common_run()
  summary <- as.data.frame(run$results[[2]])
  for (s in c("F", "M")) {
    row <- summary[summary$sex == s, ]
    income <- census$income[census$sex == s]
    expect_equal(row$variable, "income")
    expect_equal(row$mean, mean(income), tolerance = 1e-9)
    expect_equal(row$sd, sd(income), tolerance = 1e-9)
  }
  test <- as.data.frame(run$results[[5]])
  reference <- t.test(income ~ sex, data = census)
  expect_equal(abs(test$statistic), abs(unname(reference$statistic)), tolerance = 1e-9)
  expect_equal(test$df, unname(reference$parameter), tolerance = 1e-9)
  expect_equal(test$p_value, reference$p.value, tolerance = 1e-9)
})
