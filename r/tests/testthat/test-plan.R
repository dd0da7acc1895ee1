# Planning in R: formulas and filters reach the client as written in its grammar, and what the
# client refuses at plan time is refused in R with its message unchanged.

# The message the Python client gives for the same mistake, asked directly in Python.
python_message <- function(method, ...) {
  attempt <- reticulate::py_run_string(paste(
    "def attempt(url, key, name, method, *args, **kwargs):",
    "    from safeaccess.client.session import connect",
    "    with connect(url, key, name) as s:",
    "        try:",
    "            getattr(s.plan('census'), method)(*args, **kwargs)",
    "        except Exception as exc:",
    "            return str(exc)",
    sep = "\n"
  ))$attempt
  attempt(centre$url, centre$key, centre$researcher, method, ...)
}

test_that("R formulas are written in the formula grammar", {
  expect_equal(sa_formula(income ~ age + sex), "income ~ age + sex")
  expect_equal(
    sa_formula(log(income) ~ age * factor(sex) + I(age^2) - 1),
    "log(income) ~ age * C(sex) + I(age ** 2) - 1"
  )
  expect_equal(sa_formula(y ~ (a + b):c + 0), "y ~ (a + b):c + 0")
  expect_equal(sa_formula("income ~ C(region)"), "income ~ C(region)")
  expect_error(sa_formula(income ~ .), "'.' (all other columns)", fixed = TRUE)
})

test_that("R-shaped calls plan the analyses the Python methods plan", {
  p <- sa_plan(session, "census") |>
    sa_frequency_table(~ region + sex, where = "age >= 18") |>
    sa_summary(income + age ~ sex, statistics = c("mean", "sd")) |>
    sa_t_test(income ~ sex) |>
    sa_chi2(~ region + sex) |>
    sa_correlation(~ age + income) |>
    sa_ols(log(income) ~ age + I(age^2), where = "income > 0")
  dumped <- lapply(reticulate::py_to_r(p$py$analyses), function(a) a$model_dump(mode = "json"))
  expect_equal(length(p), 6L)
  expect_equal(unlist(dumped[[1]]$rows), "region")
  expect_equal(unlist(dumped[[1]]$cols), "sex")
  expect_equal(dumped[[1]]$where, "age >= 18")
  expect_equal(unlist(dumped[[2]]$variables), c("income", "age"))
  expect_equal(unlist(dumped[[2]]$by), "sex")
  expect_equal(unlist(dumped[[2]]$statistics), c("mean", "sd"))
  expect_equal(c(dumped[[3]]$test, dumped[[3]]$variable, dumped[[3]]$group),
               c("t_two_sample", "income", "sex"))
  expect_equal(c(dumped[[4]]$test, dumped[[4]]$rows, dumped[[4]]$cols),
               c("chi2_independence", "region", "sex"))
  expect_equal(unlist(dumped[[5]]$variables), c("age", "income"))
  expect_equal(dumped[[6]]$formula, "log(income) ~ age + I(age ** 2)")
  expect_equal(dumped[[6]]$where, "income > 0")
})

test_that("models, magnitude tables and DP requests take R-shaped calls too", {
  p <- sa_plan(session, "census") |>
    sa_magnitude_table(income ~ region + sex, agg = "mean", round_to = 10) |>
    sa_train_model("decision_tree", sex ~ age + region, params = list(max_depth = 3))
  dumped <- lapply(reticulate::py_to_r(p$py$analyses), function(a) a$model_dump(mode = "json"))
  expect_equal(c(dumped[[1]]$value, dumped[[1]]$agg, dumped[[1]]$rows, dumped[[1]]$cols),
               c("income", "mean", "region", "sex"))
  expect_identical(dumped[[1]]$mitigations$round_to, 10L)
  expect_equal(c(dumped[[2]]$family, dumped[[2]]$target), c("decision_tree", "sex"))
  expect_equal(unlist(dumped[[2]]$features), c("age", "region"))
  expect_identical(dumped[[2]]$params$max_depth, 3L)
  dp <- sa_plan(session, "census-dp") |>
    sa_dp_mean(age + income ~ sex, epsilon = 1, delta = 1e-7) |>
    sa_dp_histogram("age", c(16, 55, 95), epsilon = 0.5, delta = 1e-7)
  dumped <- lapply(reticulate::py_to_r(dp$py$analyses), function(a) a$model_dump(mode = "json"))
  expect_equal(unlist(dumped[[1]]$variables), c("age", "income"))
  expect_equal(unlist(dumped[[1]]$by), "sex")
  expect_equal(unlist(dumped[[2]]$edges), c(16, 55, 95))
})

test_that("a plan-time refusal is an R condition with the client's message unchanged", {
  err <- tryCatch(sa_plan(session, "census") |> sa_ols(income ~ agee + sex), error = identity)
  expect_s3_class(err, "safeaccess_AnalysisInvalid")
  expect_s3_class(err, "safeaccess_error")
  expect_equal(
    conditionMessage(err),
    python_message("ols", "income ~ agee + sex")
  )
  expect_match(conditionMessage(err), "unknown column 'agee' in dataset 'census'; did you mean 'age'?",
               fixed = TRUE)
  expect_equal(err$problems$field, "formula")
  expect_no_match(conditionMessage(err), "Traceback|File \"")
})

test_that("a filter grammar error keeps the client's caret lines", {
  err <- tryCatch(sa_plan(session, "census") |> sa_frequency_table("region", where = "age >> 3"),
                  error = identity)
  expect_s3_class(err, "safeaccess_AnalysisInvalid")
  expected <- python_message("frequency_table", "region", where = "age >> 3")
  expect_equal(conditionMessage(err), expected)
  expect_match(conditionMessage(err), "age >> 3\n +\\^")
})

test_that("a plan that changes nothing when refused", {
  p <- sa_plan(session, "census") |> sa_frequency_table("region")
  expect_error(sa_histogram(p, "region", bins = 4), class = "safeaccess_AnalysisInvalid")
  expect_equal(length(p), 1L)
})

test_that("an unknown dataset and an unknown researcher are conditions with the client's words", {
  err <- tryCatch(sa_plan(session, "censsus"), error = identity)
  expect_s3_class(err, "safeaccess_UnknownDataset")
  expect_match(conditionMessage(err), "the catalogue has no dataset 'censsus'", fixed = TRUE)
  stranger <- sa_connect(centre$url, centre$key, "eve")
  err <- tryCatch(sa_datasets(stranger), error = identity)
  expect_s3_class(err, "safeaccess_ServerError")
  expect_equal(err$code, "unauthenticated")
  expect_equal(err$status, 401L)
})

test_that("the catalogue, columns and budgets read from R", {
  datasets <- sa_datasets(session)
  expect_setequal(datasets$name, c("census", "census-dp", "cohort"))
  expect_equal(datasets$rows[datasets$name == "census"], ROWS)
  columns <- sa_columns(session, "census")
  expect_equal(columns$type[columns$name == "sex"], "categorical")
  expect_equal(columns$levels[columns$name == "sex"], "F, M")
  expect_equal(columns$bounds[columns$name == "age"], "16, 95")
  expect_output(budgets <- sa_budgets(session, "census"), "withhold budget on census")
  expect_equal(sa_health(session)$server_id, "demo-centre")
})

test_that("the Python traceback of the last condition is there on request, not in the message", {
  err <- tryCatch(sa_plan(session, "censsus"), error = identity)
  expect_no_match(conditionMessage(err), "Traceback")
  expect_output(trace <- sa_last_traceback(), "Traceback")
  expect_match(trace, "UnknownDataset: the catalogue has no dataset 'censsus'", fixed = TRUE)
})
